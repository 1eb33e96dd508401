"""The norm layers of an exported normbench model (imported by modeling_normbench.py; torch only).

Each recomputes the normbench layer of the same name op for op, so fp32 logits match to the bit and
a model cast to float64 computes in float64 throughout. The statistic norms reduce in the input
dtype promoted to at least fp32 (:func:`upcast`: fp32 for bf16/fp16/fp32, fp64 for fp64), as
normbench does; DyT and Derf compute in the input dtype.

- LayerNorm, RMSNorm: the gain is ``weight + unit_offset`` (``unit_offset`` 1 for a gain stored as
  ``1 + w``, Gemma's form; 0 otherwise).
- DyT ``g*tanh(a x)+b`` (arXiv:2503.10622), Derf ``g*erf(a x + s)+b`` (arXiv:2512.10938).
- ScaleNorm ``g * x / max(||x||, eps)`` (arXiv:1910.05895), g one scalar (sqrt(dim) when fixed).
- CRMSNorm ``x / sqrt((sum x^2 + (sum x)^2) / (n + 1) + eps)`` (arXiv:2305.14858).
- SeeDNorm ``[tanh(<x, beta>) alpha + gamma] * x / RMS(x)`` per contiguous slice (arXiv:2510.22777).
- BatchNorm and PowerNorm (arXiv:2003.07845) in their evaluation form, always: the running
  statistics saved with the weights, never a batch's. (BatchNorm's training forward mixed the
  statistics of later positions into earlier ones; the running form is causal.)
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

NORM_KINDS = ("layernorm", "rmsnorm", "dyt", "derf", "scalenorm", "crmsnorm", "seednorm", "batchnorm", "powernorm")


def upcast(x: torch.Tensor) -> torch.Tensor:
    """``x`` in at least fp32: fp64 stays fp64."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _gain(norm: nn.Module):
    if norm.weight is None or not norm.unit_offset:
        return norm.weight
    return norm.weight + norm.unit_offset


def _affine(y: torch.Tensor, weight, bias) -> torch.Tensor:
    if weight is not None:
        y = y * weight
    return y + bias if bias is not None else y


class LayerNorm(nn.Module):
    def __init__(self, dim: int, eps: float, affine: bool, bias: bool, unit_offset: float = 0.0):
        super().__init__()
        self.eps, self.unit_offset = eps, unit_offset
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None
        self.bias = nn.Parameter(torch.zeros(dim)) if affine and bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = _gain(self)
        if x.dtype == torch.float32:
            return F.layer_norm(x, x.shape[-1:], w, self.bias, self.eps)
        return _affine(F.layer_norm(upcast(x), x.shape[-1:], eps=self.eps).type_as(x), w, self.bias)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, affine: bool, unit_offset: float = 0.0):
        super().__init__()
        self.eps, self.unit_offset = eps, unit_offset
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = _gain(self)
        if x.dtype == torch.float32:
            return F.rms_norm(x, x.shape[-1:], w, self.eps)
        y = F.rms_norm(upcast(x), x.shape[-1:], eps=self.eps).type_as(x)
        return y * w if w is not None else y


class PointwiseNorm(nn.Module):
    """DyT (fn=tanh, no shift) and Derf (fn=erf, scalar shift): ``g * fn(alpha*x + shift) + b``."""

    def __init__(self, dim: int, fn, shift: bool, affine: bool, bias: bool, unit_offset: float = 0.0):
        super().__init__()
        self.fn, self.unit_offset = fn, unit_offset
        self.alpha = nn.Parameter(torch.ones(1))
        self.shift = nn.Parameter(torch.zeros(1)) if shift else None
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None
        self.bias = nn.Parameter(torch.zeros(dim)) if affine and bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.alpha * x
        if self.shift is not None:
            z = z + self.shift
        return _affine(self.fn(z), _gain(self), self.bias)


class ScaleNorm(nn.Module):
    def __init__(self, dim: int, eps: float, affine: bool):
        super().__init__()
        self.eps, self.fixed_g = eps, math.sqrt(dim)
        self.weight = nn.Parameter(torch.full((1,), math.sqrt(dim))) if affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = upcast(x)
        y = (xf / torch.linalg.vector_norm(xf, dim=-1, keepdim=True).clamp_min(self.eps)).type_as(x)
        return y * self.weight if self.weight is not None else y * self.fixed_g


class CRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, affine: bool):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = upcast(x)
        power = (xf.pow(2).sum(-1, keepdim=True) + xf.sum(-1, keepdim=True).pow(2)) / (x.shape[-1] + 1)
        y = (xf * torch.rsqrt(power + self.eps)).type_as(x)
        return y * self.weight if self.weight is not None else y


class SeeDNorm(nn.Module):
    """``weight`` is the paper's gamma, ``seed_alpha`` its alpha, ``seed_beta`` its beta."""

    def __init__(self, dim: int, eps: float, heads: int, unit_offset: float = 0.0):
        super().__init__()
        self.eps, self.heads, self.unit_offset = eps, heads, unit_offset
        self.weight = nn.Parameter(torch.ones(dim))
        self.seed_alpha = nn.Parameter(torch.ones(dim))
        self.seed_beta = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf, h = upcast(x), self.heads
        seed = (xf.unflatten(-1, (h, -1)) * self.seed_beta.view(h, -1)).sum(-1, keepdim=True)
        scale = torch.tanh(seed) * self.seed_alpha.view(h, -1) + _gain(self).view(h, -1)
        return scale.flatten(-2) * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps))


def group_scale(x: torch.Tensor, groups: int, eps: float = 1e-5) -> torch.Tensor:
    """Per token: each of ``groups`` contiguous channel groups divided by its own sqrt(mean(x^2) + eps)."""
    xg = x.unflatten(-1, (groups, -1))
    return (xg * torch.rsqrt(xg.pow(2).mean(-1, keepdim=True) + eps)).flatten(-2)


class BatchNorm(nn.Module):
    """Per-token RMS scaling, then the running mean and variance (the evaluation form)."""

    def __init__(self, dim: int, eps: float, affine: bool, bias: bool):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None
        self.bias = nn.Parameter(torch.zeros(dim)) if affine and bias else None
        self.register_buffer("running_mean", torch.zeros(dim))
        self.register_buffer("running_var", torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = group_scale(upcast(x), 1)
        flat = xf.reshape(-1, xf.shape[-1])
        y = F.batch_norm(flat, self.running_mean, self.running_var, None, None, False, 0.0, self.eps).view_as(xf)
        return _affine(y, self.weight, self.bias)


class PowerNorm(nn.Module):
    """Group RMS scaling, then ``x / sqrt(phi + eps)`` with the running quadratic mean phi."""

    def __init__(self, dim: int, eps: float, groups: int, affine: bool, bias: bool):
        super().__init__()
        self.eps, self.groups = eps, groups
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None
        self.bias = nn.Parameter(torch.zeros(dim)) if affine and bias else None
        self.register_buffer("running_phi", torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = group_scale(upcast(x), self.groups)
        return _affine(xf * torch.rsqrt(self.running_phi.to(xf.dtype) + self.eps), self.weight, self.bias)


def build_norm(spec: dict, dim: int) -> nn.Module:
    """The norm layer ``spec`` describes (a dict of the config's ``norm``), over the last ``dim`` channels."""
    kind, eps = spec["kind"], spec.get("eps")
    affine, bias, offset = spec.get("affine", True), spec.get("bias", False), spec.get("unit_offset", 0.0)
    if kind == "layernorm":
        return LayerNorm(dim, eps, affine, bias, offset)
    if kind == "rmsnorm":
        return RMSNorm(dim, eps, affine, offset)
    if kind in ("dyt", "derf"):
        return PointwiseNorm(dim, torch.tanh if kind == "dyt" else torch.erf, kind == "derf", affine, bias, offset)
    if kind == "scalenorm":
        return ScaleNorm(dim, eps, affine)
    if kind == "crmsnorm":
        return CRMSNorm(dim, eps, affine)
    if kind == "seednorm":
        return SeeDNorm(dim, eps, spec.get("heads", 1), offset)
    if kind == "batchnorm":
        return BatchNorm(dim, eps, affine, bias)
    if kind == "powernorm":
        return PowerNorm(dim, eps, spec.get("groups", 1), affine, bias)
    if kind == "none":
        return nn.Identity()
    raise ValueError(f"norm kind {kind!r} is not one of: {', '.join(NORM_KINDS)}, none")
