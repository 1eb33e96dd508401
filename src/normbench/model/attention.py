"""Causal self-attention for the GPT decoder: RoPE, the q/k norms, the KV cache used in sampling, the
attention statistics diagnostics record.

RoPE is the standard rotate-half rotation (GPT-NeoX/LLaMA): the pair (x_i, x_{i+d_h/2}) is
rotated by t * theta^(-2i/d_h); it is applied after the q/k norms (HybridNorm, OLMo 2, Qwen3
apply QK-norm before RoPE). Its table is built in the weights' dtype promoted to fp32 (fp32 for
fp32 and bf16 weights, fp64 for a ``.double()`` model), as is the loss.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from normbench.model.stabilizers import head_logit_max
from normbench.norm.norms import build_norm, upcast


def rope_cache(
    seq_len: int, head_dim: int, theta: float, device=None, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables (T, head_dim), computed in ``dtype`` promoted to at least fp32 (fp64 stays exact)."""
    dtype = torch.promote_types(dtype, torch.float32)
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=dtype) / head_dim))
    freqs = torch.outer(torch.arange(seq_len, device=device, dtype=dtype), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)  # (T, head_dim)
    return emb.cos(), emb.sin()


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fp32: bool = False, **kwargs) -> torch.Tensor:
    """``F.scaled_dot_product_attention``; with ``fp32`` under a half-precision autocast (``attn_fp32=true``), the
    kernel runs in fp32 on q, k, v cast up, its output cast to the autocast dtype as autocast's own call would
    give it. Why: torch 2.13's CPU flash-attention backward in bf16 costs ~8x its fp32 one at the miniature's
    head dim 16 (docs/performance.md §7), so a bf16 run keeps its bf16 matrix products and leaves this kernel in
    fp32 (the softmax accumulates in fp32 in the GPU kernels too). Off, or without autocast, the plain call."""
    device = q.device.type
    autocast = torch.is_autocast_enabled(device)
    if fp32 and (autocast or q.dtype in (torch.bfloat16, torch.float16)):
        out = torch.get_autocast_dtype(device) if autocast else q.dtype
        with torch.autocast(device, enabled=False):
            return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), **kwargs).to(out)
    return F.scaled_dot_product_attention(q, k, v, **kwargs)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (i, i + d/2) of x (B, H, T, d) by position-dependent angles."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x * cos + rotated * sin).type_as(x)


class Attention(nn.Module):
    """Causal self-attention; optional q/k/v norms, gate (``arch.attn_gate``) and head scale (NormFormer).

    Gate (Qiu et al. 2025, arXiv:2505.06708; qiuzh20/gated_attention, OLMo-core ``GateConfig``):
    ``Y' = Y * sigmoid(x W_g)`` after SDPA and before ``c_proj``, from the same input x as q/k/v;
    ``headwise`` one gate per head (W_g: d -> H), ``elementwise`` one per output element (d -> d);
    a separate Linear initialised like the others (the official code fuses it into q_proj); the
    sigmoid in fp32. Head scale (NormFormer, arXiv:2110.09456 eq. HeadScale): head i times c_i
    (init 1) before ``c_proj``, the paper's position (fairseq scales after out_proj).
    """

    PARAM_KINDS = {"head_scale": "scalar"}  # model/kinds.py

    def __init__(
        self,
        d: int,
        n_head: int,
        bias: bool,
        dropout: float,
        norm_cfg,
        qk_norm: bool,
        v_norm: bool,
        qk_width: bool = False,
        gate: str = "none",
        head_scale: bool = False,
    ):
        super().__init__()
        self.n_head, self.head_dim, self.dropout = n_head, d // n_head, dropout
        self.c_attn = nn.Linear(d, 3 * d, bias=bias)
        self.c_proj = nn.Linear(d, d, bias=bias)
        # after c_attn/c_proj, so a gated model draws the same q/k/v/out weights as an ungated one
        gate_width = {"none": 0, "headwise": n_head, "elementwise": d}[gate]
        self.gate = nn.Linear(d, gate_width, bias=bias) if gate_width else None
        self.head_scale = nn.Parameter(torch.ones(n_head)) if head_scale else None
        # q/k norms before RoPE: per head over head_dim (HybridNorm/Qwen3), or over all of q, k (OLMo 2)
        self.qk_width = qk_width
        qk_dim = d if qk_width else self.head_dim
        self.q_norm = build_norm(norm_cfg, qk_dim, "attn", d) if qk_norm else None
        self.k_norm = build_norm(norm_cfg, qk_dim, "attn", d) if qk_norm else None
        self.v_norm = build_norm(norm_cfg, self.head_dim, "attn", d) if v_norm else None
        self.stats = None  # set by diagnostics: dict to receive attention statistics
        self.logit_max = None  # set by stabilizers.QKClip: (H,) running max of the training logits
        self.sdpa_fp32 = False  # set by build_model from ``attn_fp32`` (:func:`sdpa`)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None, kv=None) -> torch.Tensor:
        B, T, C = x.shape
        pos = 0 if kv is None else kv.length  # sampling with a KV cache: x holds positions pos..pos+T-1
        if self.qk_width:  # OLMo 2: norm each whole projection, then split into heads
            q, k, v = self.c_attn(x).split(C, dim=-1)
            q, k = self.q_norm(q), self.k_norm(k)
            q, k, v = (t.view(B, T, self.n_head, self.head_dim) for t in (q, k, v))
        else:
            q, k, v = self.c_attn(x).view(B, T, 3, self.n_head, self.head_dim).unbind(2)
        if self.q_norm is not None and not self.qk_width:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.v_norm is not None:
            v = self.v_norm(v)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T, hd)
        if rope is not None:
            cos, sin = rope
            cos, sin = cos[pos : pos + T], sin[pos : pos + T]
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if kv is not None:
            return self.project(cached_attention(q, *kv.update(k, v)).transpose(1, 2), x)
        dropout = self.dropout if self.training else 0.0
        y = sdpa(q, k, v, self.sdpa_fp32, dropout_p=dropout, is_causal=True)
        if self.stats is not None:
            record_attention_stats(self.stats, q, k, 1.0 / math.sqrt(self.head_dim))
        if self.logit_max is not None and self.training:
            self.logit_max.copy_(torch.maximum(self.logit_max, head_logit_max(q, k, 1.0 / math.sqrt(self.head_dim))))
        return self.project(y.transpose(1, 2), x)

    def project(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Heads ``y`` (B, T, H, d_h) -> gate, head scale -> concat -> ``c_proj``; ``x`` feeds the gate."""
        B, T, H, hd = y.shape
        if self.gate is not None:
            g = torch.sigmoid(upcast(self.gate(x))).type_as(y)
            y = y * (g.unsqueeze(-1) if g.shape[-1] == H else g.view(B, T, H, hd))
        if self.head_scale is not None:
            y = y * self.head_scale.unsqueeze(-1)
        return self.c_proj(y.reshape(B, T, H * hd))


class LayerKV:
    """One block's cached keys and values (B, H, T, d_h): what sampling has seen so far."""

    def __init__(self):
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.k is not None:
            k, v = torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2)
        self.k, self.v = k, v
        return k, v


class KVCache:
    """A KV cache for ``model(idx, cache=...)``; training never builds one, so its path is unchanged."""

    def __init__(self, n_layer: int):
        self.layers = [LayerKV() for _ in range(n_layer)]

    @property
    def length(self) -> int:
        return self.layers[0].length


def cached_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Causal attention of the last ``q.shape[2]`` positions over all ``k.shape[2]`` cached ones."""
    tq, tk = q.shape[2], k.shape[2]
    if tq == tk:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    mask = None if tq == 1 else torch.ones(tq, tk, dtype=torch.bool, device=q.device).tril(tk - tq)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def record_attention_stats(stats: dict, q: torch.Tensor, k: torch.Tensor, scale: float) -> None:
    """Max pre-softmax logit and mean row entropy of causal attention (diagnostics only)."""
    T = q.shape[-2]
    logits = (upcast(q) @ upcast(k).transpose(-2, -1)) * scale
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    logits = logits.masked_fill(~mask, float("-inf"))
    logp = torch.log_softmax(logits, dim=-1)
    entropy = -(logp.exp() * logp.masked_fill(~mask, 0.0)).sum(-1)
    stats["attn_entropy"] = entropy.mean()
    stats["attn_logit_max"] = logits.amax()  # masked entries are -inf
