"""The sublayer functions of an exported normbench model (imported by modeling_normbench.py; torch only).

RoPE, the causal attention of the GPT blocks (per-head or whole-width q/k norms, v norm, gate, head
scale), the MLP (SwiGLU/GELU/ReLU, NormFormer's FFN norm), SimpleGPT's attention and MLP with a norm
after every linear map (arXiv:2602.01212, Ocram7/SimpleGPT), and Fixup's MLP with its two scalar
shifts (arXiv:1901.09321). Each mirrors the normbench module of the same name op for op.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .norms_normbench import build_norm, upcast


# ----------------------------------------------------------------------------- attention
def rope(
    positions: torch.Tensor, head_dim: int, theta: float, dtype=torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (B, 1, T, head_dim) for integer positions (B, T), in ``dtype`` promoted to fp32."""
    dtype = torch.promote_types(dtype, torch.float32)
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=dtype) / head_dim))
    freqs = positions.to(dtype)[..., None] * inv_freq
    emb = torch.cat([freqs, freqs], dim=-1)[:, None]
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return (x * cos + torch.cat([-x2, x1], dim=-1) * sin).type_as(x)


def attend(q, k, v, mask, scale=None, dropout: float = 0.0) -> torch.Tensor:
    """``mask``: None for plain causal attention over the whole (uncached) sequence, else a bool mask."""
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True, scale=scale)
    if mask is True:  # one new token attends to every cached one
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, scale=scale)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scale)


def causal_mask(attention_mask, past: int, T: int, device):
    """None (plain causal), True (no mask needed) or a (B|1, 1, T, past+T) bool mask."""
    padded = attention_mask is not None and not bool(attention_mask[:, : past + T].all())
    if not padded:
        if past == 0:
            return None
        if T == 1:
            return True
    mask = torch.ones(T, past + T, dtype=torch.bool, device=device).tril(past)[None, None]
    if padded:
        keys = attention_mask[:, None, None, : past + T].bool()
        own = torch.zeros_like(mask)
        own[..., torch.arange(T), past + torch.arange(T)] = True  # a padded query row still sees itself
        mask = (mask & keys) | own
    return mask


class Attention(nn.Module):
    def __init__(self, config, spec: dict):
        super().__init__()
        d, self.n_head = config.hidden_size, config.num_attention_heads
        self.head_dim, self.dropout = d // self.n_head, config.dropout
        self.c_attn = nn.Linear(d, 3 * d, bias=config.bias)
        self.c_proj = nn.Linear(d, d, bias=config.bias)
        gate = int(spec.get("gate_width", 0))  # H (one gate per head), d (per element) or 0
        self.gate = nn.Linear(d, gate, bias=config.bias) if gate else None
        self.head_scale = nn.Parameter(torch.ones(self.n_head)) if spec.get("head_scale") else None
        self.qk_width = bool(spec.get("qk_width", False))  # one q and one k norm over the whole width
        qk, qk_dim = spec.get("qk_norm", False), d if self.qk_width else self.head_dim
        self.q_norm = build_norm(config.norm, qk_dim) if qk else None
        self.k_norm = build_norm(config.norm, qk_dim) if qk else None
        self.v_norm = build_norm(config.norm, self.head_dim) if spec.get("v_norm", False) else None

    def forward(self, x, ctx: dict) -> torch.Tensor:
        B, T, C = x.shape
        if self.qk_width:
            q, k, v = self.c_attn(x).split(C, dim=-1)
            q, k = self.q_norm(q), self.k_norm(k)
            q, k, v = (t.view(B, T, self.n_head, self.head_dim) for t in (q, k, v))
        else:
            q, k, v = self.c_attn(x).view(B, T, 3, self.n_head, self.head_dim).unbind(2)
            if self.q_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)
        if self.v_norm is not None:
            v = self.v_norm(v)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if ctx["rope"] is not None:
            cos, sin = ctx["rope"]
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if ctx["cache"] is not None:
            k, v = ctx["cache"].update(k, v, ctx["layer"])
        y = attend(q, k, v, ctx["mask"], dropout=self.dropout if self.training else 0.0).transpose(1, 2)
        H, hd = self.n_head, self.head_dim
        if self.gate is not None:  # the sigmoid in at least fp32
            g = torch.sigmoid(upcast(self.gate(x))).type_as(y)
            y = y * (g.unsqueeze(-1) if g.shape[-1] == H else g.view(B, T, H, hd))
        if self.head_scale is not None:
            y = y * self.head_scale.unsqueeze(-1)
        return self.c_proj(y.reshape(B, T, H * hd))


class MLP(nn.Module):
    def __init__(self, config, mid_norm: bool = False):
        super().__init__()
        d, d_ff, self.kind = config.hidden_size, config.intermediate_size, config.mlp
        self.c_fc = nn.Linear(d, 2 * d_ff if self.kind == "swiglu" else d_ff, bias=config.bias)
        self.c_proj = nn.Linear(d_ff, d, bias=config.bias)
        self.mid_norm = build_norm(config.norm, d_ff) if mid_norm else None  # NormFormer's FFN norm

    def forward(self, x: torch.Tensor, ctx: dict | None = None) -> torch.Tensor:
        h = self.c_fc(x)
        if self.kind == "swiglu":
            up, gate = h.chunk(2, dim=-1)
            h = up * F.silu(gate)
        elif self.kind == "gelu":
            h = F.gelu(h)
        else:
            h = F.relu(h)
        if self.mid_norm is not None:
            h = self.mid_norm(h)
        return self.c_proj(h)


class SimpleAttention(nn.Module):
    """SimpleGPT: a norm after each of q, k, v (whole width, before RoPE) and after the out-projection."""

    def __init__(self, config):
        super().__init__()
        d, self.n_head = config.hidden_size, config.num_attention_heads
        self.head_dim, self.dropout = d // self.n_head, config.dropout
        self.c_attn = nn.Linear(d, 3 * d, bias=config.bias)
        self.c_proj = nn.Linear(d, d, bias=config.bias)
        self.q_norm, self.k_norm, self.v_norm, self.o_norm = (build_norm(config.norm, d) for _ in range(4))

    def forward(self, x, ctx: dict) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=-1)
        pairs = ((self.q_norm, q), (self.k_norm, k), (self.v_norm, v))
        q, k, v = (n(t).view(B, T, self.n_head, self.head_dim).transpose(1, 2) for n, t in pairs)
        if ctx["rope"] is not None:
            cos, sin = ctx["rope"]
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if ctx["cache"] is not None:
            k, v = ctx["cache"].update(k, v, ctx["layer"])
        y = attend(q, k, v, ctx["mask"], dropout=self.dropout if self.training else 0.0)
        return self.o_norm(self.c_proj(y.transpose(1, 2).reshape(B, T, C)))


class SimpleMLP(nn.Module):
    """SimpleGPT's FFN: SwiGLU's up and gate each normalized (GELU/ReLU: the one up-projection), then W_down, a norm."""

    def __init__(self, config):
        super().__init__()
        d, d_ff, self.kind = config.hidden_size, config.intermediate_size, config.mlp
        self.c_fc = nn.Linear(d, 2 * d_ff if self.kind == "swiglu" else d_ff, bias=config.bias)
        self.c_proj = nn.Linear(d_ff, d, bias=config.bias)
        self.fc_norm = build_norm(config.norm, d_ff)
        self.gate_norm = build_norm(config.norm, d_ff) if self.kind == "swiglu" else None
        self.down_norm = build_norm(config.norm, d)

    def forward(self, x: torch.Tensor, ctx: dict | None = None) -> torch.Tensor:
        h = self.c_fc(x)
        if self.kind == "swiglu":
            up, gate = h.chunk(2, dim=-1)
            h = F.silu(self.gate_norm(gate)) * self.fc_norm(up)
        else:
            h = (F.gelu if self.kind == "gelu" else F.relu)(self.fc_norm(h))
        return self.down_norm(self.c_proj(h))


class FixupMLP(MLP):
    """The MLP with Fixup's scalar shifts before the activation and before W_down."""

    def __init__(self, config):
        super().__init__(config)
        self.shift_act = nn.Parameter(torch.zeros(1))
        self.shift_proj = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor, ctx: dict | None = None) -> torch.Tensor:
        h = self.c_fc(x) - self.shift_act
        if self.kind == "swiglu":
            up, gate = h.chunk(2, dim=-1)
            h = up * F.silu(gate)
        else:
            h = F.gelu(h) if self.kind == "gelu" else F.relu(h)
        return self.c_proj(h - self.shift_proj)
