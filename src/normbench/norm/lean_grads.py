"""Normalizations whose backward skips autograd's recomputations, with the same bits.

Why hand-written: on CPU, eager PyTorch differentiates ``F.normalize`` and ``F.rms_norm`` op by op.
Its backward recomputes quantities the forward already had (``x / ||x||``, ``x ** 1``), negates a
full-size tensor, and broadcasts a per-row scalar into a full-size copy before multiplying: about
ten memory passes over the activation where six do. These Functions save what the forward computed
and do only the passes whose results differ, **in the same order and with the same kernels**, so
the gradients are bit-identical to autograd's (tests/test_lean_grads.py checks ``torch.equal``
against ``F.normalize``/``F.rms_norm``, alone and for every gradient of whole models).
Two facts make that possible: negation and scaling by 2 are exact in IEEE arithmetic, and a value
recomputed from the same inputs with the same kernel has the same bits as the saved one.

Gradient accumulation order is part of the bits: where a tensor feeds the norm and other ops,
autograd adds the contributions in the order they arrive. The composite's backward delivers two
contributions to ``x``, one after the other (the direct path and the path through the statistic);
these Functions take ``x`` as two inputs, one per contribution, so that autograd adds them in the
same order, and a third one (e.g. the residual stream's) in the same place.

The formulas replayed are PyTorch's own (pytorch/pytorch ``tools/autograd/derivatives.yaml``: ``div``,
``clamp_min``, ``linalg_vector_norm``, ``pow``, ``mean``, ``rsqrt``, ``mul``), checked op by op
against a dispatch trace of torch 2.13's CPU backward. A torch release that reorders them would
show as a bit difference in the tests above; the gradient's math would still be the same.

Used on eager fp32 CPU tensors without autocast only: under ``torch.compile`` the composites stay,
as inductor fuses them into one or two kernels anyway; for bf16, autocast and CUDA nothing changes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class _L2Normalize(torch.autograd.Function):
    """``x / max(||x||_2, eps)`` along the last dim, as ``F.normalize(x, dim=-1, eps=eps)``.

    ``x`` comes in twice: ``x_divided`` (the numerator) and ``x_measured`` (inside the norm)."""

    @staticmethod
    def forward(ctx, x_divided: torch.Tensor, x_measured: torch.Tensor, eps: float) -> torch.Tensor:
        x = x_divided
        n = torch.linalg.vector_norm(x, 2, -1, keepdim=True)
        d = n.clamp_min(eps)
        y = x / d
        ctx.save_for_backward(y, n, d)
        ctx.eps = eps
        return y

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        y, n, d = ctx.saved_tensors
        # autograd: the division's two gradients, g / d and sum(-g * ((x / d) / d)); x / d is y
        grad_d = (g * (y / d)).sum(-1, keepdim=True).neg_()
        # clamp_min passes the gradient where n >= eps; the norm's backward is grad * x / n, which is
        # y there. Where n < eps it is 0 times a finite x / n, a zero as 0 * y is (only in an all-zero
        # row can the zero's sign differ, where autograd masks 0 / 0 to +0).
        grad_n = torch.where(n >= ctx.eps, grad_d, 0.0)
        return g / d, grad_n * y, None


class _RMSNorm(torch.autograd.Function):
    """``x * rsqrt(mean(x^2) + eps) * w`` along the last dim, as ``F.rms_norm`` in eager CPU fp32.

    ``x`` comes in twice (``x_scaled``: the ``x * rsqrt(..)`` factor, ``x_squared``: the ``x ** 2``
    inside the mean) so that autograd adds the two gradient contributions to ``x`` separately, in
    the order the composite's backward delivers them."""

    @staticmethod
    def forward(ctx, x_scaled, x_squared, w, eps: float):
        x = x_scaled
        rstd = x.pow(2).mean(-1, keepdim=True).add_(eps).rsqrt_()
        x_hat = x * rstd
        ctx.save_for_backward(x, rstd, x_hat, w)
        return x_hat * w if w is not None else x_hat

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        x, rstd, x_hat, w = ctx.saved_tensors
        grad_w = None
        if w is not None:
            grad_w = (g * x_hat).sum(tuple(range(g.dim() - 1))) if ctx.needs_input_grad[2] else None
            g = g * w
        grad_rstd = (g * x).sum(-1, keepdim=True)
        grad_scaled = g * rstd
        # rsqrt's backward, then the mean's (a broadcast / N) and pow's (* 2 * x): per row, one scalar
        # times x. autograd multiplies the broadcast copy by 2 and then by x; (c / N) * 2 is exact.
        grad_mean = grad_rstd * (rstd.pow(3) * -0.5)
        coef = grad_mean / x.shape[-1] * 2.0
        return grad_scaled, coef * x, grad_w, None


def _eager_fp32(x: torch.Tensor) -> bool:
    """Where the bits were checked: fp32 CPU tensors, eager, no autocast (which casts per op)."""
    return (
        x.dtype == torch.float32
        and x.device.type == "cpu"
        and not torch.compiler.is_compiling()
        and not torch.is_autocast_enabled("cpu")
    )


def l2_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``F.normalize(x, dim=-1, eps=eps)``; its lean backward on eager fp32 CPU tensors."""
    if _eager_fp32(x) and torch.is_grad_enabled() and x.requires_grad:
        return _L2Normalize.apply(x, x, eps)
    return F.normalize(x, dim=-1, eps=eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """``F.rms_norm(x, x.shape[-1:], weight, eps)``; its lean backward on eager fp32 CPU tensors."""
    needs_grad = x.requires_grad or (weight is not None and weight.requires_grad)
    if _eager_fp32(x) and torch.is_grad_enabled() and needs_grad:
        return _RMSNorm.apply(x, x, weight, eps)
    return F.rms_norm(x, x.shape[-1:], weight, eps)
