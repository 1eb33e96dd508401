"""Training stabilizers that act on the weights between optimizer steps: QK-Clip.

QK-Clip (Kimi K2's MuonClip: Kimi Team 2025, "Kimi K2: Open Agentic Intelligence", arXiv:2507.20534;
reference implementation NVIDIA/Megatron-LM ``clip_qk`` / ``qk_clip``; Su Jianlin, "QK-Clip",
kexue.fm/archives/11126). After every optimizer step, for every attention head h::

    S_h   = max over the step's micro-batches, batch rows and causal pairs (i, j <= i) of q_i.k_j / sqrt(d_h)
    gamma = min(1, tau / S_h)
    W_q^h <- sqrt(gamma) W_q^h ,   W_k^h <- sqrt(gamma) W_k^h        (alpha = 1/2)

so a head whose largest pre-softmax logit exceeded tau is rescaled to give exactly tau on the
inputs that produced it; every other head is multiplied by 1.0, i.e. left bit-exact. RoPE is a
rotation, linear in q and k, so the rescale commutes with it. The statistic is the post-RoPE,
post-scale logit that the softmax sees; under DDP it is all-reduced with MAX before use. It works
with any optimizer (optimizer states are not touched, as in Megatron).

The interface is three calls: :meth:`QKClip.from_config` (None when ``optim.qk_clip=false``),
:meth:`QKClip.step` after each optimizer step, :meth:`QKClip.metrics` at a log step. An attention
module takes part by having a ``logit_max`` attribute (None = off) and updating it in its training
forward with :func:`head_logit_max`.

Deviations and limits (docs/architectures.md §6.1):
- Every normbench head has its own W_k (no GQA), so the clip is per query head, as for MHA in the
  paper (Megatron clips a GQA group together). With ``model.bias=true`` the q/k biases are scaled
  with their rows, so the head's logits scale by exactly gamma (Megatron leaves biases alone; K2
  has none).
- Refused where it cannot act: after q/k norms (``arch.qk_norm``, hybridnorm*: a scale-invariant
  norm after W_q/W_k cancels the rescale, as the Megatron docs note), for nGPT (q and k are
  L2-normalized, the logits are set by s_qk), and under FSDP2 (the q/k rows are sharded).
- SDPA does not return its logits: the max is an eager side computation, one head at a time
  (a B x T x T buffer), only while QK-Clip is on.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

from normbench.config.arch_traits import arch_traits
from normbench.errors import ConfigError
from normbench.model.placement import arch_names


@torch.no_grad()
def head_logit_max(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """(H,) largest causal pre-softmax logit ``q_i . k_j * scale`` (j <= i) of each head; q, k (B, H, T, d_h)."""
    dtype = torch.promote_types(q.dtype, torch.float32)
    T = q.shape[-2]
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    out = []
    for h in range(q.shape[1]):  # one head at a time: a (B, T, T) buffer instead of (B, H, T, T)
        s = (q[:, h].to(dtype) @ k[:, h].to(dtype).transpose(-2, -1)) * scale
        out.append(s.masked_fill(future, float("-inf")).amax())
    return torch.stack(out)


def _qk_norm_on(arch: Any) -> bool:
    value = getattr(arch, "qk_norm", False)
    return value is not None and str(value).lower() not in ("false", "none")


def check_config(cfg: Any) -> None:
    """``optim.qk_clip`` combinations that cannot work: one-line ConfigError."""
    o, a = cfg.optim, cfg.arch
    if o.qk_clip_tau <= 0 or o.qk_clip_tau != o.qk_clip_tau:
        raise ConfigError(f"optim.qk_clip_tau={o.qk_clip_tau} must be > 0")
    if not o.qk_clip:
        return
    traits = arch_traits(a.name)
    if traits.unit_norm_geometry:
        raise ConfigError(
            f"optim.qk_clip=true with arch={a.name}: nGPT L2-normalizes q and k, so rescaling W_q/W_k changes no "
            "logit (its logits are set by s_qk); allowed: any other arch"
        )
    if _qk_norm_on(a) or traits.qk_normed:
        why = f"arch.qk_norm={a.qk_norm}" if _qk_norm_on(a) else f"arch={a.name} (always has q/k norms)"
        qk_normed = [name for name in arch_names() if arch_traits(name).qk_normed]
        raise ConfigError(
            f"optim.qk_clip=true with {why}: a norm after W_q/W_k cancels the rescale; "
            f"allowed: arch.qk_norm off and an arch other than {', '.join(qk_normed)}"
        )
    if cfg.parallel == "fsdp":
        raise ConfigError(
            "optim.qk_clip=true with parallel=fsdp: W_q/W_k rows are sharded; allowed: parallel=none, ddp"
        )


class QKClip:
    """Per-head QK-Clip over the attention modules of ``model`` (those with a ``logit_max`` slot)."""

    def __init__(self, model: torch.nn.Module, tau: float):
        self.tau = float(tau)
        self.attns = [m for m in model.modules() if hasattr(m, "logit_max")]
        if not self.attns:
            raise ValueError("QK-Clip: the model has no attention module with a logit_max slot")
        for m in self.attns:
            if getattr(m, "q_norm", None) is not None:
                raise ValueError("QK-Clip: q/k norms after W_q/W_k would cancel the rescale")
            w = m.c_attn.weight
            m.logit_max = torch.full(
                (m.n_head,), -math.inf, device=w.device, dtype=torch.promote_types(w.dtype, torch.float32)
            )
        self._window: torch.Tensor | None = None  # (L, H) max since the last metrics()
        self._clipped: torch.Tensor | None = None  # (L,) head rescalings since the last metrics()

    @classmethod
    def from_config(cls, cfg: Any, model: torch.nn.Module) -> QKClip | None:
        return cls(model, cfg.optim.qk_clip_tau) if cfg.optim.qk_clip else None

    @torch.no_grad()
    def step(self, apply: bool | torch.Tensor = True) -> torch.Tensor:
        """After an optimizer step: all-reduce the step's per-head max logits, rescale the heads
        above tau (unless ``apply`` is false: a skipped step; a 0-dim bool tensor where only the device
        knows, so nothing waits for it: a head it holds back is multiplied by exactly 1), reset. Returns the
        (L, H) maxima."""
        s = torch.stack([m.logit_max for m in self.attns])
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(s, op=dist.ReduceOp.MAX)
        over = s > self.tau  # NaN and -inf (no training forward) never count
        if apply is not False:
            gamma = torch.where(over & apply, self.tau / s, torch.ones_like(s)).sqrt()
            for m, g in zip(self.attns, gamma):
                _scale_qk_rows(m, g)
        for m in self.attns:
            m.logit_max.fill_(-math.inf)
        self._window = s if self._window is None else torch.maximum(self._window, s)
        n = (over & apply).sum(-1)
        self._clipped = n if self._clipped is None else self._clipped + n
        return s

    def metrics(self) -> dict[str, list]:
        """Per block: the largest logit measured (over heads and the steps since the previous call)
        and how many head rescalings QK-Clip made; {} when no step ran since."""
        if self._window is None:
            return {}
        out = {
            "qk_clip_logit_max": self._window.amax(-1).tolist(),
            "qk_clip_heads": [int(n) for n in self._clipped.tolist()],
        }
        self._window = self._clipped = None
        return out


def _scale_qk_rows(attn: torch.nn.Module, g: torch.Tensor) -> None:
    """Multiply head h's rows of W_q and W_k (and their biases) in the fused c_attn by g[h]."""
    d = attn.n_head * attn.head_dim
    rows = g.repeat_interleave(attn.head_dim)
    for p in (attn.c_attn.weight, attn.c_attn.bias):
        if p is None:
            continue
        r = rows.to(p.dtype).view(-1, *([1] * (p.dim() - 1)))
        p[:d].mul_(r)
        p[d : 2 * d].mul_(r)
