"""Further norm layers from the papers: ScaleNorm, CRMSNorm, SeeDNorm, BatchNorm (leaks), PowerNorm (causal-safe).

Each registers its ``norm=`` name with :func:`register_norm` and declares its parameters' kinds
(model/kinds.py). Equations, defaults and deviations: docs/architectures.md §2.

- ScaleNorm: Nguyen & Salazar 2019, "Transformers without Tears" (arXiv:1910.05895);
  tnq177/transformers_without_tears layers.py ``ScaleNorm``: ``g * x / max(||x||_2, eps)`` with ONE
  learnable scalar g per site, init sqrt(d), eps a clamp on the norm (not added to the sum of squares).
  Deviation: the norm is computed in at least fp32 (the reference uses the input dtype).
- CRMSNorm: Jiang et al. 2023, "Pre-RMSNorm and Pre-CRMSNorm Transformers" (arXiv:2305.14858);
  ZixuanJiang/pre-rmsnorm-transformer torch/customized_layer.py ``CRMSNorm``: ``x`` (width n) is the
  compressed form of a zero-mean ``z = [x, -sum(x)]`` (width n + 1), and
  ``CRMSNorm(x) = x / sqrt((sum(x^2) + sum(x)^2) / (n + 1) + eps) = LayerNorm(z)[:n]``. ``norm=crmsnorm`` is
  the reference's ``pre-crms-same-dim`` method: the residual stays d_model wide, so the model is exactly a
  Pre-LN model whose residual is d_model + 1 wide (zero-mean) with the same attention/MLP widths. The
  reference's ``pre-crms`` (residual d - 1, equal to Pre-LN at width d) needs a residual narrower than the
  attention, which our GPT does not have. Optional gain (the reference is affine-free: a gain folds into
  the next linear layer), computed in at least fp32 as the reference.
- SeeDNorm: arXiv:2510.22777 (no official code; we follow the paper's equations):
  ``[tanh(<x, beta>) * alpha + gamma] * x / RMS(x)``, ``alpha, beta, gamma`` in R^d, the seed
  ``<x, beta>`` taken from the raw x, one per token (or per contiguous slice with ``norm.seed_heads``).
  Init gamma = 1, beta = 0, alpha = 1: exactly RMSNorm at init. The paper does not say whether the
  final norm was replaced; ``norm.seed_final=false`` (default, our choice on a measurement) keeps
  RMSNorm there (``SeeDNorm.final_norm``, read by norm/norms.py build_norm), ``true`` puts SeeDNorm there too.
- BatchNorm: the PowerNorm paper's baseline (sIncerass/powernorm ``MaskSyncBatchNorm``): a per-token
  RMS scaling, then batch statistics over batch x time (momentum 0.05, eps 1e-5). Its training forward
  lets a token see the future (the batch mean and variance include later positions), so training with
  it is refused unless ``norm.allow_leak=true`` (its class declares ``leaks``: norm/norm_api.py).
- PowerNorm: Shen et al. 2020 (arXiv:2003.07845), sIncerass/powernorm ``MaskPowerNorm``: per-token
  group RMS scaling, then ``z = x / sqrt(phi + eps)`` with the running quadratic mean phi and the
  approximate backward. Causal-safe form: the reference's warmup (``warmup_iters`` steps dividing by
  the *batch* quadratic mean) leaks the future; we default to ``norm.pn_warmup=0`` so the forward uses
  only phi from earlier steps, and refuse a warmup without ``norm.allow_leak=true``.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from normbench.config.arch_traits import arch_traits
from normbench.config.norm_keys import BatchNormKeys, NormKeys, PowerNormKeys, SeeDNormKeys
from normbench.config.schema import qk_norm_mode
from normbench.errors import ConfigError
from normbench.norm.norm_api import LEAK, Norm
from normbench.norm.norms import gain, register_norm, upcast


def _refuse_qk_norm(cfg) -> None:
    """Batch-statistic norms replace the block norms only, not the q/k norms."""
    qk = qk_norm_mode(cfg.arch.qk_norm)
    if qk != "none":
        raise ConfigError(
            f"arch.qk_norm={qk} with norm={cfg.norm.name}: batch-statistic norms replace the block norms only"
        )


class ScaleNorm(Norm):
    """``g * x / max(||x||_2, eps)``; g one scalar, init sqrt(dim) (fixed at sqrt(dim) with affine=False)."""

    PARAM_KINDS = {"weight": "norm"}
    keys = NormKeys

    def __init__(self, dim: int, eps: float = 1e-5, affine: bool = True):
        super().__init__()
        self.eps = eps
        self.fixed_g = math.sqrt(dim)
        self.weight = nn.Parameter(torch.full((1,), math.sqrt(dim))) if affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = upcast(x)
        y = (xf / torch.linalg.vector_norm(xf, dim=-1, keepdim=True).clamp_min(self.eps)).type_as(x)
        return y * self.weight if self.weight is not None else y * self.fixed_g


class CRMSNorm(Norm):
    """``x / sqrt((sum(x^2) + sum(x)^2) / (n + 1) + eps)`` (times an optional gain): LayerNorm of ``[x, -sum(x)]``."""

    PARAM_KINDS = {"weight": "norm"}
    keys = NormKeys

    @classmethod
    def check(cls, cfg) -> list[str]:
        a, qk = cfg.arch, qk_norm_mode(cfg.arch.qk_norm)
        if qk != "none" or arch_traits(a.name).qkv_norms:
            raise ConfigError(
                f"norm=crmsnorm with {f'arch.qk_norm={qk}' if qk != 'none' else f'arch={a.name}'}: CRMSNorm reads "
                "its input as a compressed zero-mean residual, which q/k/v are not; allowed: arch.qk_norm=none, "
                "not hybridnorm*"
            )
        return []

    def __init__(self, dim: int, eps: float = 1e-5, affine: bool = False):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = upcast(x)
        power = (xf.pow(2).sum(-1, keepdim=True) + xf.sum(-1, keepdim=True).pow(2)) / (x.shape[-1] + 1)
        y = (xf * torch.rsqrt(power + self.eps)).type_as(x)
        return y * self.weight if self.weight is not None else y


class SeeDNorm(Norm):
    """``[tanh(<x_i, beta_i>) * alpha + gamma] * x / RMS(x)`` per slice i of ``heads`` contiguous slices.

    ``weight`` is the paper's gamma, ``seed_alpha`` its alpha, ``seed_beta`` its beta (vectors: no
    ``diag_scalars``).
    """

    PARAM_KINDS = {"weight": "norm", "seed_alpha": "scalar", "seed_beta": "scalar"}
    has_gain = True  # gamma is a per-channel gain: arch.gain_offset stores it as 1 + w (norm/norms.offset_gain)
    unit_offset = 0.0
    keys = SeeDNormKeys

    @classmethod
    def final_norm(cls, n) -> str | None:
        """norm.seed_final=false: SeeDNorm in the blocks only, RMSNorm at the final norm."""
        return None if getattr(n, "seed_final", True) else "rmsnorm"

    @classmethod
    def check(cls, cfg) -> list[str]:
        n, m = cfg.norm, cfg.model
        if not n.affine:
            raise ConfigError("norm.affine=false with norm=seednorm: gamma, alpha, beta are the method; allowed: true")
        widths = [m.d_model] + ([m.d_model // m.n_head] if qk_norm_mode(cfg.arch.qk_norm) == "head" else [])
        if any(w % n.seed_heads for w in widths):
            raise ConfigError(f"norm.seed_heads={n.seed_heads} must divide the normalized widths {widths}")
        return []

    def __init__(self, dim: int, eps: float = 1e-6, heads: int = 1, alpha_init: float = 1.0):
        super().__init__()
        if dim % heads:
            raise ValueError(f"SeeDNorm: heads={heads} must divide the width {dim}")
        self.eps, self.heads = eps, heads
        self.weight = nn.Parameter(torch.ones(dim))
        self.seed_alpha = nn.Parameter(torch.full((dim,), float(alpha_init)))
        self.seed_beta = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = upcast(x)
        h = self.heads
        seed = (xf.unflatten(-1, (h, -1)) * self.seed_beta.view(h, -1)).sum(-1, keepdim=True)  # (..., h, 1)
        scale = torch.tanh(seed) * self.seed_alpha.view(h, -1) + gain(self).view(h, -1)
        return scale.flatten(-2) * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps))


def group_scale(x: torch.Tensor, groups: int, eps: float = 1e-5) -> torch.Tensor:
    """Per token: each of ``groups`` contiguous channel groups divided by its own sqrt(mean(x^2) + eps)."""
    xg = x.unflatten(-1, (groups, -1))
    return (xg * torch.rsqrt(xg.pow(2).mean(-1, keepdim=True) + eps)).flatten(-2)


class BatchNormBT(Norm):
    """Per-token RMS scaling, then BatchNorm over all batch x time positions (training) or running stats (eval).

    The training forward mixes every position's statistics into every output: position t sees t+1...
    """

    PARAM_KINDS = {"weight": "norm", "bias": "bias"}
    keys = BatchNormKeys

    @classmethod
    def leaks(cls, n) -> bool:
        return True

    @classmethod
    def check(cls, cfg) -> list[str]:
        _refuse_qk_norm(cfg)
        return []

    def __init__(self, dim: int, eps: float = 1e-5, momentum: float = 0.05, affine: bool = True, bias: bool = True):
        super().__init__()
        self.eps, self.momentum = eps, momentum
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None
        self.bias = nn.Parameter(torch.zeros(dim)) if affine and bias else None
        self.register_buffer("running_mean", torch.zeros(dim))
        self.register_buffer("running_var", torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = group_scale(upcast(x), 1)
        flat = xf.reshape(-1, xf.shape[-1])
        y = F.batch_norm(
            flat, self.running_mean, self.running_var, None, None, self.training, self.momentum, self.eps
        ).view_as(xf)
        if self.weight is not None:
            y = y * self.weight
        return y + self.bias if self.bias is not None else y


class _PowerFunction(torch.autograd.Function):
    """z = x / sqrt(denom + eps) forward; PowerNorm's approximate backward (Shen et al. 2020, Alg. 1).

    ``dL/dx = (g - (1 - a_bkw) * nu * z) / sqrt(psi2_B + eps)`` with the *current batch's* quadratic
    mean psi2_B (as the reference, even when the forward used the running phi); nu (``ema_gz``) is
    then moved by ``mean((g - (1 - a_bkw) nu z) * z)`` over all positions, in place.
    """

    @staticmethod
    def forward(ctx, x, denom, psi2, ema_gz, eps: float, a_bkw: float):
        z = x * torch.rsqrt(denom + eps)
        ctx.save_for_backward(z, psi2)
        ctx.ema_gz, ctx.eps, ctx.a_bkw = ema_gz, eps, a_bkw
        return z

    @staticmethod
    def backward(ctx, g):
        z, psi2 = ctx.saved_tensors
        nu = ctx.ema_gz.to(z.dtype)
        approx = g - (1.0 - ctx.a_bkw) * nu * z
        ctx.ema_gz.add_((approx * z).mean(0).to(ctx.ema_gz.dtype))
        return approx * torch.rsqrt(psi2 + ctx.eps), None, None, None, None, None


class PowerNorm(Norm):
    """Group RMS scaling, then x / sqrt(phi + eps) with the running quadratic mean phi, then gamma, beta.

    Training: ``phi <- a_fwd * phi + (1 - a_fwd) * psi2_B`` after the forward used the old phi
    (psi2_B: per-channel mean of x^2 over batch x time). With ``warmup`` > 0 the first ``warmup``
    training forwards divide by psi2_B instead (the reference's warmup; leaks the future) and phi
    is a cumulative average over them before the EMA, as in the reference.
    """

    PARAM_KINDS = {"weight": "norm", "bias": "bias"}
    keys = PowerNormKeys

    @classmethod
    def leaks(cls, n) -> bool:
        """The reference's batch-statistic warmup (``norm.pn_warmup`` > 0) leaks; phi alone does not."""
        return int(n.pn_warmup or 0) > 0

    @classmethod
    def leak_refusal(cls, n) -> str:
        return f"norm.pn_warmup={n.pn_warmup} {LEAK}; the causal-safe powernorm has pn_warmup=0"

    @classmethod
    def check(cls, cfg) -> list[str]:
        _refuse_qk_norm(cfg)
        if cfg.model.d_model % cfg.norm.pn_groups:
            raise ConfigError(f"norm.pn_groups={cfg.norm.pn_groups} must divide model.d_model={cfg.model.d_model}")
        return []

    def __init__(
        self,
        dim: int,
        eps: float = 1e-5,
        alpha_fwd: float = 0.9,
        alpha_bkw: float = 0.9,
        groups: int = 1,
        warmup: int = 0,
        affine: bool = True,
        bias: bool = True,
    ):
        super().__init__()
        if dim % groups:
            raise ValueError(f"PowerNorm: groups={groups} must divide the width {dim}")
        self.eps, self.alpha_fwd, self.alpha_bkw, self.groups, self.warmup = eps, alpha_fwd, alpha_bkw, groups, warmup
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None
        self.bias = nn.Parameter(torch.zeros(dim)) if affine and bias else None
        self.register_buffer("running_phi", torch.ones(dim))
        self.register_buffer("ema_gz", torch.zeros(dim))
        self.register_buffer("iters", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = group_scale(upcast(x), self.groups)
        if self.training:
            flat = xf.reshape(-1, xf.shape[-1])
            with torch.no_grad():
                psi2 = flat.pow(2).mean(0)
                phi = self.running_phi.to(flat.dtype)
                self.iters += 1
                step = int(self.iters) if self.warmup else 1  # no host sync without a warmup
            denom = psi2 if step <= self.warmup else phi
            z = _PowerFunction.apply(flat, denom, psi2, self.ema_gz, self.eps, self.alpha_bkw).view_as(xf)
            with torch.no_grad():  # after the forward used the old phi (reference order)
                if step < self.warmup:
                    self.running_phi.mul_((step - 1) / step).add_(psi2.to(self.running_phi.dtype) / step)
                self.running_phi.mul_(self.alpha_fwd).add_((1 - self.alpha_fwd) * psi2.to(self.running_phi.dtype))
        else:
            z = xf * torch.rsqrt(self.running_phi.to(xf.dtype) + self.eps)
        if self.weight is not None:
            z = z * self.weight
        return z + self.bias if self.bias is not None else z


register_norm("scalenorm", ScaleNorm)(lambda cfg, dim, alpha: ScaleNorm(dim, eps=cfg.eps, affine=cfg.affine))
register_norm("crmsnorm", CRMSNorm)(lambda cfg, dim, alpha: CRMSNorm(dim, eps=cfg.eps, affine=cfg.affine))
register_norm("seednorm", SeeDNorm)(
    lambda cfg, dim, alpha: SeeDNorm(dim, eps=cfg.eps, heads=cfg.seed_heads, alpha_init=cfg.seed_alpha_init)
)
register_norm("batchnorm", BatchNormBT)(
    lambda cfg, dim, alpha: BatchNormBT(dim, eps=cfg.eps, momentum=cfg.bn_momentum, affine=cfg.affine, bias=cfg.bias)
)
register_norm("powernorm", PowerNorm)(
    lambda cfg, dim, alpha: PowerNorm(
        dim,
        eps=cfg.eps,
        alpha_fwd=cfg.pn_alpha_fwd,
        alpha_bkw=cfg.pn_alpha_bkw,
        groups=cfg.pn_groups,
        warmup=cfg.pn_warmup,
        affine=cfg.affine,
        bias=cfg.bias,
    )
)
