"""Muon (Jordan et al. 2024, https://kellerjordan.github.io/posts/muon/), written out on torch's public API.

References: KellerJordan/Muon (``muon.py``: ``zeropower_via_newtonschulz5``, ``muon_update``,
``SingleDeviceMuon``) and ``torch.optim.Muon`` (torch 2.9+, ``torch/optim/_muon.py``). Per matrix
W (m x n) with gradient G, momentum ``mu`` and decoupled weight decay ``wd``:

- ``B = mu*B + (1-mu)*G`` (the momentum buffer as an EMA, ``B.lerp_(G, 1-mu)``);
- nesterov: ``U = (1-mu)*G + mu*B`` (``G.lerp(B, mu)``), else ``U = B``;
- ``O = NS5(U)``: U in bf16, transposed to be wide, divided by ``max(||U||_F, eps)``, then 5 quintic
  Newton-Schulz steps ``X = a*X + (b*A + c*A@A) @ X`` with ``A = X@X.T`` and Keller Jordan's
  coefficients (3.4445, -4.7750, 2.0315);
- ``W *= 1 - lr*wd`` (with the unadjusted lr); ``W -= lr * s * O`` with ``s = sqrt(max(1, m/n))``
  (``adjust_lr_fn`` None/"original", Keller Jordan's) or ``0.2*sqrt(max(m, n))`` ("match_rms_adamw",
  Moonshot's).

Every operation is torch.optim.Muon's (as torch 2.13 computes it), in the same order and dtypes, so
a step gives torch's parameters and momentum buffers bit for bit, and the constructor, its defaults,
the param groups' keys (plus ``split``) and the state (``momentum_buffer``) are torch's, so a checkpoint of either
loads into the other. torch's rounding differs from KellerJordan/Muon's: eps is a floor on the norm
there and added to it in KellerJordan/Muon, the Newton-Schulz products are fused (``addmm``), and the
lr adjustment is the step's fp32 ``alpha`` instead of a multiplication of the bf16 update. Like
torch, a parameter without a gradient is skipped (KellerJordan/Muon steps it with a zero gradient),
and the gradient is left as it is (KellerJordan/Muon's nesterov ``lerp_`` overwrites it).

Where normbench deviates from both:

- a param group with ``split=k`` has each of its matrices cut into k equal row blocks (views), and
  every block is updated as a separate matrix (its own Newton-Schulz and ``s``): the fused attention
  ``c_attn`` as q, k and v, a SwiGLU ``c_fc`` as up and gate (as modded-nanogpt's separate
  ``c_q/c_k/c_v``). ``split=1`` (the default) is torch's Muon. The momentum buffers stay whole-matrix
  state of the real parameters;
- the division by the norm is out of place: torch divides in place, which for a bf16 parameter with
  ``nesterov=False`` rescales the momentum buffer itself (normbench's parameters are fp32, where the
  two are the same bits).
"""

from __future__ import annotations

import math

import torch

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # KellerJordan/Muon's quintic; torch.optim.Muon's defaults
LR_ADJUSTMENTS = (None, "original", "match_rms_adamw")


def newton_schulz5(update: torch.Tensor, coefficients=NS_COEFFICIENTS, steps: int = 5, eps: float = 1e-7):
    """``update`` orthogonalized in bf16, as torch's Muon: not U V^T of its SVD but about U S' V^T with
    S' in (0.5, 1.5) (KellerJordan/Muon's docstring: the coefficients favour speed over convergence)."""
    if steps >= 100:  # torch's refusal, word for word
        raise ValueError("Number of steps must be less than 100 for computational efficiency")
    a, b, c = coefficients
    tall = update.size(0) > update.size(1)
    x = update.bfloat16()
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


def adjusted_lr(lr: float, adjust_lr_fn: str | None, shape: torch.Size) -> float:
    """The lr of the orthogonalized step on a matrix (block) of ``shape`` (torch's ``adjust_lr_fn``)."""
    rows, cols = shape[:2]
    if adjust_lr_fn == "match_rms_adamw":
        return lr * (0.2 * math.sqrt(max(rows, cols)))
    return lr * math.sqrt(max(1, rows / cols))


class Muon(torch.optim.Optimizer):
    """Muon on 2-D parameters, each group's matrices in ``split`` row blocks (module docstring)."""

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
        eps: float = 1e-7,
        ns_steps: int = 5,
        adjust_lr_fn: str | None = None,
    ):
        # torch's checks and messages
        for what, value in (("Learning rate", lr), ("momentum", momentum), ("weight decay", weight_decay)):
            if not 0.0 <= value:
                raise ValueError(f"{what} should be >= 0 but is: {value}")
        if adjust_lr_fn not in LR_ADJUSTMENTS:
            raise ValueError(f"Adjust learning rate function {adjust_lr_fn} is not supported")
        defaults = dict(
            lr=lr,
            weight_decay=weight_decay,
            momentum=momentum,
            nesterov=nesterov,
            ns_coefficients=ns_coefficients,
            eps=eps,
            ns_steps=ns_steps,
            adjust_lr_fn=adjust_lr_fn,
        )
        super().__init__(params, defaults)
        for group in self.param_groups:
            k = group.setdefault("split", 1)
            for p in group["params"]:
                if p.ndim != 2:
                    raise ValueError(
                        f"Muon only supports 2D parameters whereas we found a parameter with size: {p.size()}"
                    )
                if p.shape[0] % k:
                    raise ValueError(f"Muon split={k} does not divide a matrix of shape {tuple(p.shape)}")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, wd, mu, k = group["lr"], group["weight_decay"], group["momentum"], group.get("split", 1)
            for p in group["params"]:
                if p.grad is None:
                    continue
                if torch.is_complex(p):
                    raise RuntimeError("Muon does not support complex parameters")
                if p.grad.is_sparse:
                    raise RuntimeError("Muon does not support sparse gradients")
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
                for w, g, buf in zip(p.chunk(k), p.grad.chunk(k), state["momentum_buffer"].chunk(k)):
                    buf.lerp_(g, 1 - mu)
                    update = g.lerp(buf, mu) if group["nesterov"] else buf
                    ortho = newton_schulz5(update, group["ns_coefficients"], group["ns_steps"], group["eps"])
                    w.mul_(1 - lr * wd)
                    w.add_(ortho, alpha=-adjusted_lr(lr, group["adjust_lr_fn"], w.shape))
        return loss
