"""Normalization layers: LayerNorm, RMSNorm, DyT, Derf, none.

References (equations and citations in docs/architectures.md §2):
- LayerNorm: karpathy/nanoGPT model.py (eps 1e-5, optional bias).
- RMSNorm: statistics in fp32, cast back before the gain (NVIDIA/ngpt model.py, OLMo).
- DyT: Zhu et al. 2025, arXiv:2503.10622, jiachenzhu/DyT dynamic_tanh.py:
  ``y = g * tanh(a x) + b`` with ONE learnable scalar a (shape [1]). conf/norm/dyt.yaml follows
  the LLaMA recipe (other_tasks/LLaMA/.../llama.py): no bias, separate a0 for the attention,
  FFN and final sites, and a learnable embedding scalar initialised to sqrt(d).
- Derf: zlab-princeton/Derf, arXiv:2512.10938: ``y = g * erf(a x + s) + b``, scalars a and s.
  conf/norm/derf.yaml follows the GPT-2 patch (language model/model_derf.patch): bias on, per-site
  a0 at the recipe default 1.0 (the class default 0.5 is the ViT value), s0 = 0, embedding scalar.

a0 by width (:func:`alpha_rule`, used where ``norm.alpha_init_*`` is null): DyT takes the
LLaMA README's table by d_model (7B d=4096: 0.8/0.2/0.2, 13B d=5120: 0.6/0.15/0.15, 34B/70B
d=8192: 0.2/0.05/0.05 for attn/ffn/final); narrower than the table, the paper only says "narrower
-> larger a0", so we use the LLaMA code's default 1.0 at every site. Derf publishes no width rule:
1.0 everywhere (its patch default). Why DyT/Derf trail the statistic norms at the presets' init:
docs/dyt-derf.md, docs/init.md.

Sites (:data:`SITES`, which a0 a DyT/Derf gets): a norm takes the site of the sublayer it
belongs to. ``attn``: the attention input norm (Pre/Peri/Mix-LN, HybridNorm* block 0), Peri-LN's
attention output norm, the Post-LN/DeepNorm norm after the attention residual, and the per-head
q/k/v norms. ``ffn``: the same for the MLP sublayer (HybridNorm's ``z = N(x + attn)`` included).
``final``: ln_f. ``embed`` (Peri-LN's optional embedding norm) uses the final a0. The references
only define the Pre-LN sites (ln_1 -> attn, ln_2 -> ffn, ln_f -> final); the rest is our choice.

Deviations: the statistics-free layers (DyT/Derf) compute in the input dtype; the statistic
layers (LayerNorm/RMSNorm) reduce in at least fp32 (:func:`upcast`: fp32 under bf16 autocast,
fp64 for fp64 inputs) and return the input dtype before the gain is applied (so an fp32 gain
gives an fp32 output under autocast).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from normbench.config.norm_keys import NormKeys, PointwiseKeys
from normbench.errors import ConfigError
from normbench.norm import lean_grads
from normbench.norm.norm_api import NORMS, Norm, norm_class, register_norm

__all__ = ["NORMS", "Norm", "register_norm"]  # the registry lives in norm/norm_api.py; read here too

# Sites a norm can sit at; DyT/Derf take their initial alpha from the site.
SITES = ("attn", "ffn", "final", "embed")


def upcast(x: torch.Tensor) -> torch.Tensor:
    """``x`` in at least fp32: bf16/fp16 statistics run in fp32, fp64 stays fp64 (exact in fp64)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def gain(norm: nn.Module) -> torch.Tensor | None:
    """The gain a norm multiplies by: its ``weight``, plus ``offset`` where :func:`offset_gain` set one."""
    if norm.weight is None or not norm.unit_offset:
        return norm.weight
    return norm.weight + norm.unit_offset


def offset_gain(norm: nn.Module) -> None:
    """Store the gain as ``1 + w`` (Gemma's RMSNorm, google/gemma_pytorch): the same gain at once, ``w``
    shifted by -1 (w = 0 for a gain of 1). Weight decay on ``w`` then pulls the gain toward 1, not 0.
    Only for the norms that declare a per-channel gain vector (``has_gain``: LayerNorm, RMSNorm, DyT, Derf,
    SeeDNorm)."""
    if not getattr(type(norm), "has_gain", False) or getattr(norm, "weight", None) is None:
        raise ValueError(f"{type(norm).__name__} has no gain vector to store as 1 + w")
    with torch.no_grad():
        norm.weight.sub_(1.0)
    norm.unit_offset = 1.0


class LayerNorm(Norm):
    PARAM_KINDS = {"weight": "norm", "bias": "bias"}  # model/kinds.py
    has_gain, line_style, keys = True, "-", NormKeys

    def __init__(self, dim: int, eps: float = 1e-5, affine: bool = True, bias: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None
        self.bias = nn.Parameter(torch.zeros(dim)) if affine and bias else None

    unit_offset = 0.0  # gain = weight + unit_offset (offset_gain: Gemma's 1 + w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = gain(self)
        if x.dtype == torch.float32:  # one fused kernel; same math as below
            return F.layer_norm(x, x.shape[-1:], w, self.bias, self.eps)
        y = F.layer_norm(upcast(x), x.shape[-1:], eps=self.eps).type_as(x)
        if w is not None:
            y = y * w
        if self.bias is not None:
            y = y + self.bias
        return y


class RMSNorm(Norm):
    PARAM_KINDS = {"weight": "norm"}
    has_gain, line_style, keys = True, "--", NormKeys

    def __init__(self, dim: int, eps: float = 1e-6, affine: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None

    unit_offset = 0.0  # gain = weight + unit_offset (offset_gain: Gemma's 1 + w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = gain(self)
        if x.dtype == torch.float32:  # same math as below, with autograd's gradient in fewer passes
            return lean_grads.rms_norm(x, w, self.eps)
        y = F.rms_norm(upcast(x), x.shape[-1:], eps=self.eps).type_as(x)
        return y * w if w is not None else y


class _PointwiseNorm(Norm):
    """``g * fn(alpha * x + shift) + b`` with scalar alpha (and shift)."""

    fn = staticmethod(torch.tanh)
    PARAM_KINDS = {"weight": "norm", "bias": "bias", "alpha": "scalar", "shift": "scalar"}
    has_gain, statistics_free, keys = True, True, PointwiseKeys
    unit_offset = 0.0  # gain = weight + unit_offset (offset_gain)

    def __init__(self, dim: int, alpha_init: float, affine: bool, bias: bool, shift_init: float | None):
        super().__init__()
        self.alpha = nn.Parameter(torch.full((1,), float(alpha_init)))
        self.shift = None if shift_init is None else nn.Parameter(torch.full((1,), float(shift_init)))
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None
        self.bias = nn.Parameter(torch.zeros(dim)) if affine and bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.alpha * x
        if self.shift is not None:
            z = z + self.shift
        y = self.fn(z)
        if self.weight is not None:
            y = y * gain(self)
        if self.bias is not None:
            y = y + self.bias
        return y


class DyT(_PointwiseNorm):
    fn = staticmethod(torch.tanh)
    diag_scalars, line_style = ("alpha",), ":"

    def __init__(self, dim: int, alpha_init: float = 0.5, affine: bool = True, bias: bool = False):
        super().__init__(dim, alpha_init, affine, bias, shift_init=None)


class Derf(_PointwiseNorm):
    fn = staticmethod(torch.erf)
    diag_scalars, line_style = ("alpha", "shift"), "-."

    def __init__(
        self, dim: int, alpha_init: float = 0.5, shift_init: float = 0.0, affine: bool = True, bias: bool = False
    ):
        super().__init__(dim, alpha_init, affine, bias, shift_init=shift_init)


# jiachenzhu/DyT other_tasks/LLaMA/README.md: (smallest d_model, a0 attn, a0 ffn and final), widest first
DYT_ALPHA_BY_WIDTH = ((8192, 0.2, 0.05), (5120, 0.6, 0.15), (4096, 0.8, 0.2))


def alpha_rule(name: str, d_model: int) -> dict[str, float]:
    """Default a0 per site (attn, ffn, final) for a model of width ``d_model`` (module docstring)."""
    if name == "dyt":
        for width, attn, rest in DYT_ALPHA_BY_WIDTH:
            if d_model >= width:
                return {"attn": attn, "ffn": rest, "final": rest}
    return {"attn": 1.0, "ffn": 1.0, "final": 1.0}


def site_alphas(cfg, d_model: int) -> dict[str, float]:
    """a0 per site: ``norm.alpha_init_<site>`` where set, else :func:`alpha_rule`."""
    rule = alpha_rule(cfg.name, d_model)
    set_ = {"attn": cfg.alpha_init_attn, "ffn": cfg.alpha_init_ffn, "final": cfg.alpha_init_final}
    return {site: rule[site] if value is None else float(value) for site, value in set_.items()}


class NoNorm(Norm):
    """``norm=none``: declares the option; it builds ``nn.Identity`` (no parameters, nothing to declare)."""

    identity, line_style = True, (0, (5, 1, 1, 1))


# ``norm=`` names (docs/architectures.md §2): a norm registers its class (or a builder with the class that
# declares it) with register_norm, here or from anywhere (norm/norm_api.py says what a class declares).
register_norm("layernorm", LayerNorm)(
    lambda cfg, dim, alpha: LayerNorm(dim, eps=cfg.eps, affine=cfg.affine, bias=cfg.bias)
)
register_norm("rmsnorm", RMSNorm)(lambda cfg, dim, alpha: RMSNorm(dim, eps=cfg.eps, affine=cfg.affine))
register_norm("dyt", DyT)(lambda cfg, dim, alpha: DyT(dim, alpha_init=alpha, affine=cfg.affine, bias=cfg.bias))
register_norm("derf", Derf)(
    lambda cfg, dim, alpha: Derf(dim, alpha_init=alpha, shift_init=cfg.shift_init, affine=cfg.affine, bias=cfg.bias)
)
register_norm("none", NoNorm)(lambda cfg, dim, alpha: nn.Identity())


def build_norm(cfg, dim: int, site: str = "attn", d_model: int | None = None) -> nn.Module:
    """The configured norm layer for one site (``attn``, ``ffn``, ``final`` or ``embed``).

    ``d_model``: the model width that picks a0 by :func:`alpha_rule` (default ``dim``; a per-head
    q/k/v norm passes the model width, not its head width).
    """
    if site not in SITES:
        raise ValueError(f"unknown norm site {site!r}")
    if cfg.name not in NORMS:
        raise ConfigError(f"norm.name={cfg.name!r} is not allowed; choose one of: {', '.join(NORMS)}")
    alpha = site_alphas(cfg, d_model or dim)["final" if site == "embed" else site]
    name = (norm_class(cfg.name).final_norm(cfg) or cfg.name) if site == "final" else cfg.name
    return NORMS[name](cfg, dim, alpha)


class EmbedScale(nn.Module):
    """The DyT/Derf LLM recipe's learnable scalar on the embedding output, init sqrt(d)."""

    PARAM_KINDS = {"scale": "scalar"}

    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.full((1,), math.sqrt(dim)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale
