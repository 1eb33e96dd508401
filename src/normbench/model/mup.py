"""The maximal-update parametrization (muP) in width and CompleteP in depth: ``model.param: sp | mup | completep``.

Under ``sp`` (the default) nothing here acts and the model and optimizer are today's, bit for bit. Under
``mup`` the width multiplier is m = d_model / d_base (``model.mup_base_width``, 64: model=tiny's width, where
every claim's LR was tuned) and, after Yang et al. 2022 (Tensor Programs V, arXiv:2203.03466, Table 3's
Adam column; microsoft/mup's MuReadout / MuAdam), in the multiplier form that is exact at m = 1:

- a hidden matrix (both dimensions grow with width): init std d_base's times sqrt(fan_in_base / fan_in) (its
  own fan-in ratio: SwiGLU's c_proj 192 -> 704), Adam/Lion LR eta * fan_in_base / fan_in;
  weight decay lambda*m (``optim.mup_decay=width``: lr*lambda width-invariant, microsoft/mup's MuAdam),
  unchanged (``coupled``) or 0 (``none``); Adam eps/m with ``optim.mup_eps=width`` (Everett et al. 2024,
  arXiv:2407.05872: muP gradients shrink like 1/m, so a fixed eps weighs more with width);
- the embedding and the readout: init std held at its d_base value, LR eta; the logits times 1/m (the
  readout multiplier; one form for tied and untied heads, microsoft/mup's MuSharedReadout);
- vectors and scalars (norm gains and biases, DyT/Derf alpha and shift, SeeDNorm's, NormFormer's head
  and residual scales): LR eta, no decay;
- attention: d_head is held at ``model.mup_head_dim`` on every rung (the head count grows with width), so the
  1/sqrt(d_head) logit scale is the same everywhere and needs no 1/d_head rule.

Which parameter is which is read from its kind (model/kinds.py) and from its shape against the same model
built at d_base on the meta device (microsoft/mup's base shapes): a dimension that differs grows with width.
``completep`` adds depth (Dey et al. 2025, arXiv:2505.01618, alpha = 1; EleutherAI/nanoGPT-mup's completep
branch): each residual branch times L_base/L, no 1/sqrt(2L) output-projection init on top, hidden LR
unchanged in depth (L^(alpha-1) = 1) and, inside the residual branches only, eps also divided by L/L_base
(the embedding, final norm and head outside them: eps/m; :func:`branch_params`). Only placements whose residual
stream is never normalized (Pre-LN's family, read from the block specs) get it.

Muon: its orthogonalized update already has the spectral size the muP condition asks of a hidden matrix
(Yang, Simon & Bernstein 2023, arXiv:2310.17813; Essential AI 2025, arXiv:2505.02222 shows muP + Muon transfer),
so its matrices keep their LR; the AdamW side gets the rules above. SGD and Adafactor are refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from normbench.config.arch_traits import arch_traits
from normbench.errors import ConfigError

ADAM_LIKE = ("adamw", "lion")  # entrywise-normalized updates: Adam's table applies
KEEP_MATRIX_LR = ("muon",)  # the hidden matrices' update is width-scaled by the optimizer itself


def active(mcfg: Any) -> bool:
    return getattr(mcfg, "param", "sp") != "sp"


def width_mult(mcfg: Any) -> float:
    """m = d_model / d_base under mup/completep, else 1."""
    return mcfg.d_model / mcfg.mup_base_width if active(mcfg) else 1.0


def depth_mult(mcfg: Any) -> float:
    """L / L_base under completep, else 1."""
    return mcfg.n_layer / mcfg.mup_base_depth if getattr(mcfg, "param", "sp") == "completep" else 1.0


class _AtWidth:
    """``mcfg`` read at another width (for the init rules evaluated at d_base)."""

    def __init__(self, mcfg: Any, d_model: int):
        self._mcfg, self.d_model = mcfg, d_model

    def __getattr__(self, name: str):
        return getattr(self._mcfg, name)


def hidden_std(rule, mcfg: Any, arch: Any) -> float:
    """A hidden matrix's std: ``rule`` (the model class's init rule) at d_base times sqrt(d_base / d)."""
    base = mcfg.mup_base_width
    return rule(_AtWidth(mcfg, base), arch) * math.sqrt(base / mcfg.d_model)


def base_std(rule, mcfg: Any, arch: Any) -> float:
    """The embedding's (and an untied readout's) std: ``rule`` at d_base, constant in width."""
    return rule(_AtWidth(mcfg, mcfg.mup_base_width), arch)


def residual_side_free(specs) -> bool:
    """Pre-LN's family: no sublayer normalizes or rescales the residual stream, no depth rule of its own."""
    subs = [s for b in specs for s in (b.attn, b.mlp)]
    return all(
        not s.post_norm and not s.residual_after_norm and s.alpha == 1.0 and s.in_scale == 1.0 and s.out_gain == 1.0
        for s in subs
    )


def check(cfg: Any, own_model: bool) -> list[str]:
    """Refusals (ConfigError, one line) and the start-up note of ``model.param``; ``own_model``: the arch builds
    a model class of its own (nGPT, SimpleGPT, the norm-free nets; model.model_class), whose init is its own."""
    m, a, o = cfg.model, cfg.arch, cfg.optim
    if not active(m):
        return []
    key = f"model.param={m.param}"
    if own_model:
        why = arch_traits(a.name).own_init
        raise ConfigError(f"{key} does not apply to arch={a.name}: {why}; use model.param=sp")
    if o.name not in ADAM_LIKE + KEEP_MATRIX_LR:
        raise ConfigError(f"{key} has rules for optim=adamw, lion, muon; optim={o.name} has none here")
    if m.mup_base_width <= 0 or m.d_model % m.mup_base_width and m.mup_base_width % m.d_model:
        raise ConfigError(
            f"model.mup_base_width={m.mup_base_width} must divide model.d_model={m.d_model} or be "
            "a multiple of it (so the base model's shapes are whole)"
        )
    head_dim = m.d_model // m.n_head
    if head_dim != m.mup_head_dim or m.mup_base_width % m.mup_head_dim:
        raise ConfigError(
            f"{key} holds d_head at model.mup_head_dim={m.mup_head_dim} on every width (the head count grows): "
            f"model.d_model/model.n_head is {head_dim}; set model.n_head={max(1, m.d_model // m.mup_head_dim)}"
        )
    if m.d_ff:
        raise ConfigError(f"{key} needs model.d_ff=null (a fixed d_ff does not grow with width)")
    vectors = [k for k in ("decay_norm_in", "decay_norm_out", "decay_bias", "decay_scalars") if getattr(o, k)]
    if vectors and o.weight_decay:
        raise ConfigError(f"{key} gives vectors and scalars no weight decay: set optim.{vectors[0]}=false")
    notes = [f"{key}: width x{width_mult(m):g} of d_base {m.mup_base_width} (docs/mup.md)"]
    if m.param == "completep":
        from normbench.model.placement import block_specs  # deferred (start-up time): hydra, omegaconf

        if a.tiny_init or not residual_side_free(block_specs(a, m.n_layer)):
            raise ConfigError(
                f"model.param=completep covers Pre-LN-family placements only (no norm on the residual stream, "
                f"no depth rule of its own); arch={a.name} is not one: use model.param=mup"
            )
        if m.mup_base_depth <= 0:
            raise ConfigError(f"model.mup_base_depth={m.mup_base_depth} must be > 0")
        notes.append(f"model.param=completep: residual branches x{1 / depth_mult(m):g} (L_base {m.mup_base_depth})")
    return notes


@dataclass(frozen=True)
class Scale:
    """One parameter's multipliers of the optimizer's lr, weight decay and eps."""

    lr: float = 1.0
    wd: float = 1.0
    eps: float = 1.0


ONE = Scale()


def base_config(cfg: Any) -> Any:
    """``cfg`` at d_base (d_head held): the config of the model whose shapes are the base shapes."""
    return _Replaced(cfg, model=base_model_config(cfg.model))


def base_model_config(mcfg: Any) -> Any:
    """The ``model`` section at d_base, d_head held (the head count shrinks with the width)."""
    base = mcfg.mup_base_width
    return _Replaced(mcfg, d_model=base, n_head=base // mcfg.mup_head_dim)


def base_fan_ins(build, mcfg: Any) -> dict[str, int]:
    """Each Linear's fan_in in the same model built at d_base on the meta device (``build(model section)``), by
    module name; {} under sp and at d_base, where every ratio is 1 and no twin is built."""
    if not active(mcfg) or mcfg.d_model == mcfg.mup_base_width:
        return {}
    with torch.device("meta"):
        twin = build(base_model_config(mcfg))
    return {n: mod.in_features for n, mod in twin.named_modules() if isinstance(mod, nn.Linear)}


def shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    return {n: tuple(p.shape) for n, p in model.named_parameters()}


class _Replaced:
    """A config section with some attributes replaced (the rest read through)."""

    def __init__(self, inner: Any, **values):
        self._inner, self._values = inner, values

    def __getattr__(self, name: str):
        values = self.__dict__.get("_values", {})
        return values[name] if name in values else getattr(self._inner, name)


def branch_params(model: nn.Module) -> set[int]:
    """The ids of the parameters inside a residual branch (model/gpt.py ``Sublayer.branch``): CompleteP's
    branch multiplier L_base / L scales their gradients, so their Adam eps takes the depth factor too. The
    embedding, the final norm, the head and NormFormer's residual scale sit outside every branch: their
    gradients do not shrink with depth and their eps is divided by m only (EleutherAI/nanoGPT-mup, docs/mup.md)."""
    # A sublayer is found by its ``branch()`` method, not its class: gpt.py imports this module, and
    # importing gpt.Sublayer here would close an import circle (tests/test_house.py).
    subs = [mod for mod in model.modules() if callable(getattr(mod, "branch", None))]
    return {id(p) for sub in subs for part in sub.branch() for p in part.parameters()}


def param_scales(model: nn.Module, cfg: Any, kinds: dict[str, str], base: dict[str, tuple[int, ...]]) -> dict:
    """name -> :class:`Scale` for every parameter whose optimizer settings muP changes (empty under sp);
    ``base``: each parameter's shape in the same model at d_base (:func:`base_config`, :func:`shapes`)."""
    m, o = cfg.model, cfg.optim
    if not active(m):
        return {}
    params = dict(model.named_parameters())
    in_branch = branch_params(model) if depth_mult(m) != 1.0 else set()
    out: dict[str, Scale] = {}
    for name, kind in kinds.items():
        shape, ref = tuple(params[name].shape), base.get(name)
        if ref is None or len(ref) != len(shape):
            raise ConfigError(
                f"model.param={m.param}: parameter {name} has no counterpart at d_base; use model.param=sp"
            )
        grows = [s != r for s, r in zip(shape, ref)]
        eps_depth = depth_mult(m) if id(params[name]) in in_branch else 1.0
        eps = 1.0 / (width_mult(m) * eps_depth) if o.mup_eps == "width" else 1.0
        if kind == "matrix" and all(grows):  # fan_out x fan_in, both in width: the hidden rule
            mult = shape[1] / ref[1]
            lr = 1.0 if o.name in KEEP_MATRIX_LR else 1.0 / mult
            wd = {"width": mult, "coupled": 1.0, "none": 0.0}[o.mup_decay]
            out[name] = Scale(lr, wd if o.name not in KEEP_MATRIX_LR else 1.0, eps)
        elif kind == "matrix" and any(grows):
            raise ConfigError(
                f"model.param={m.param}: matrix {name} grows with width on one side only; use model.param=sp"
            )
        elif eps != 1.0:
            out[name] = Scale(1.0, 1.0, eps)
    return out
