"""SimpleGPT: a norm after every linear map (SimpleNorm, arXiv:2602.01212; code: Ocram7/SimpleGPT).

Equations and deviations: docs/architectures.md §8.1.

Reference: Ocram7/SimpleGPT src/torchtitan/models/llama/simplegpt_model.py (``SimpleNorm``,
``Attention``, ``FeedForward``, ``TransformerBlock``, ``SimpleGPT.init_weights``) @ 3ebabaf,
the Llama/torchtitan variant, the only one released. ``arch=simplenorm`` computes, with
``N`` the configured norm (``norm=rmsnorm`` as the reference, or ``norm=layernorm``)::

    q = N_q(W_q x), k = N_k(W_k x), v = N_v(W_v x)    # each over the whole width d, before the
                                                      # split into heads and before RoPE
    h  = x + N_o(W_o SDPA(RoPE(q), RoPE(k), v))
    x' = h + N_down(W_down(silu(N_gate(W_gate h)) * N_up(W_up h)))     # model.mlp=swiglu
    x' = h + N_down(W_down(act(N_fc(W_fc h))))                         # model.mlp=gelu/relu
    logits = W_head N_f(x_L)

There is no norm on a sublayer input; the residual adds are plain, and every branch output has RMS
equal to its output norm's gain (1 at init). Softmax scale 1/sqrt(d_h).

Init (``SimpleGPT.init_weights``): token embedding N(0, 1); ``trunc_normal_`` (torch's default
cut at +-2, absolute) with std 0.02 (the reference's; a number in ``model.init_std`` replaces it,
``auto``/``fan_in`` keep it: every such matrix feeds a scale-invariant norm, so no width transfer is
needed) on q, k, v and the SwiGLU gate, and with
``init_std / sqrt(2 (l + 1))`` (0-based block l, the reference's ``depth_init``) on the output
projection, W_down and W_up; the untied LM head trunc-normal d^-0.5 cut at +-3 std; norm gains 1.
Each of those linears is followed by a scale-invariant norm, so its std only sets its effective
learning rate.

Deviations, on purpose:
- The LM head is always untied (the reference has a separate ``output``); ``model.tie_embeddings``
  is ignored with a start-up note (a head tied to the N(0, 1) embedding would give logits ~sqrt(d)).
- ``norm.eps`` is used (RMSNorm 1e-6); the reference's ModelArgs sets 1e-5: ``norm.eps=1e-5``.
- ``model.mlp=gelu|relu`` (not in the reference) keeps the rule "a norm after every linear":
  ``N_fc`` after the single up-projection. A learned position table (``model.pos=learned``) is drawn
  like the token embedding, N(0, 1).
- The norms' parameter kinds: the output norms N_o and N_down carry the branch output (``norm_out``);
  N_q, N_k, N_v and the FFN's inner norms feed a matrix (``norm_in``).
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from normbench.model.attention import apply_rope, cached_attention, record_attention_stats, sdpa
from normbench.model.gpt import GPT, Sublayer, default_d_ff
from normbench.model.placement import BlockSpec, SublayerSpec, register_placement
from normbench.norm.norms import build_norm

# The norm layers SimpleNorm may use: the reference's create_norm offers RMSNorm and LayerNorm.
SIMPLENORM_NORMS = ("rmsnorm", "layernorm")


# SimpleGPT: norms after q, k, v, o, down (d each) and gate, up (d_ff ~ 8d/3 each), none on inputs: ~8 more
@register_placement(
    "simplenorm",
    model="simplegpt",
    needs_norm=False,
    extra_norms=8,
    qk_normed=True,
    own_init="SimpleNorm's GPT has its own init (std 0.02, depth-scaled outputs; model/simplegpt.py)",
)
def _simplenorm(arch, n_layer: int) -> list[BlockSpec]:
    """No norm around the sublayers: SimpleGPT's norms sit inside them (SimpleAttention, SimpleMLP)."""
    return [BlockSpec(SublayerSpec(), SublayerSpec())] * n_layer


class SimpleAttention(nn.Module):
    """Causal self-attention with a norm after each of q, k, v (whole width) and after W_o."""

    def __init__(self, d: int, n_head: int, bias: bool, dropout: float, norm_cfg):
        super().__init__()
        self.n_head, self.head_dim, self.dropout = n_head, d // n_head, dropout
        self.c_attn = nn.Linear(d, 3 * d, bias=bias)  # rows: W_q, W_k, W_v
        self.c_proj = nn.Linear(d, d, bias=bias)
        self.q_norm, self.k_norm, self.v_norm, self.o_norm = (build_norm(norm_cfg, d, "attn") for _ in range(4))
        self.stats = None  # set by diagnostics
        self.sdpa_fp32 = False  # set by build_model from ``attn_fp32`` (attention.sdpa)

    def residual_side(self) -> list[nn.Module]:
        return [self.o_norm]

    def forward(self, x: torch.Tensor, rope, kv=None) -> torch.Tensor:
        B, T, C = x.shape
        pos = 0 if kv is None else kv.length
        q, k, v = self.c_attn(x).split(C, dim=-1)
        q, k, v = (
            n(t).view(B, T, self.n_head, self.head_dim).transpose(1, 2)
            for n, t in ((self.q_norm, q), (self.k_norm, k), (self.v_norm, v))
        )
        if rope is not None:
            cos, sin = rope
            cos, sin = cos[pos : pos + T], sin[pos : pos + T]
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if kv is not None:
            y = cached_attention(q, *kv.update(k, v))
        else:
            y = sdpa(q, k, v, self.sdpa_fp32, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
            if self.stats is not None:
                record_attention_stats(self.stats, q, k, 1.0 / math.sqrt(self.head_dim))
        return self.o_norm(self.c_proj(y.transpose(1, 2).reshape(B, T, C)))


class SimpleMLP(nn.Module):
    """The FFN with a norm after each linear map (SwiGLU: gate and up each normalized, then down)."""

    def __init__(self, d: int, d_ff: int, kind: str, bias: bool, norm_cfg):
        super().__init__()
        self.kind = kind
        self.c_fc = nn.Linear(d, 2 * d_ff if kind == "swiglu" else d_ff, bias=bias)  # swiglu rows: [up; gate]
        self.c_proj = nn.Linear(d_ff, d, bias=bias)
        self.fc_norm = build_norm(norm_cfg, d_ff, "ffn")  # N_up (swiglu) or N_fc
        self.gate_norm = build_norm(norm_cfg, d_ff, "ffn") if kind == "swiglu" else None
        self.down_norm = build_norm(norm_cfg, d, "ffn")

    def residual_side(self) -> list[nn.Module]:
        return [self.down_norm]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.c_fc(x)
        if self.kind == "swiglu":
            up, gate = h.chunk(2, dim=-1)
            h = F.silu(self.gate_norm(gate)) * self.fc_norm(up)
        else:
            h = (F.gelu if self.kind == "gelu" else F.relu)(self.fc_norm(h))
        return self.down_norm(self.c_proj(h))


class SimpleBlock(nn.Module):
    def __init__(self, mcfg, norm_cfg, d_ff: int):
        super().__init__()
        d, plain = mcfg.d_model, SublayerSpec()  # x + f(x): the norms are inside f
        attn = SimpleAttention(d, mcfg.n_head, mcfg.bias, mcfg.dropout, norm_cfg)
        self.attn = Sublayer(plain, attn, norm_cfg, d, "attn", mcfg.dropout)
        self.mlp = Sublayer(plain, SimpleMLP(d, d_ff, mcfg.mlp, mcfg.bias, norm_cfg), norm_cfg, d, "ffn", mcfg.dropout)

    def forward(self, x: torch.Tensor, rope, kv=None) -> torch.Tensor:
        return self.mlp(self.attn(x, rope) if kv is None else self.attn(x, rope, kv))


class SimpleGPT(GPT):
    """GPT with SimpleGPT blocks, an untied head and SimpleGPT's init (module docstring)."""

    def __init__(self, mcfg, arch, norm_cfg, vocab_size: int):
        if mcfg.tie_embeddings:
            mcfg = copy.deepcopy(mcfg)
            mcfg.tie_embeddings = False
        super().__init__(mcfg, arch, norm_cfg, vocab_size)

    def make_block(self, index: int, spec: BlockSpec, mcfg, arch, norm_cfg) -> nn.Module:
        return SimpleBlock(mcfg, norm_cfg, default_d_ff(mcfg))

    @staticmethod
    def init_std(mcfg, arch) -> float:
        """SimpleGPT's std for the matrices before its norms: the reference's 0.02 unless a number is set."""
        return float(mcfg.init_std) if isinstance(mcfg.init_std, (int, float)) else 0.02

    @torch.no_grad()
    def _init_weights(self, mcfg, arch) -> None:
        std, d = self.init_std(mcfg, arch), mcfg.d_model
        emb_std = arch.embed_init_std if arch.embed_init_std is not None else 1.0
        for emb in (self.wte, self.wpe):
            if emb is not None:
                nn.init.normal_(emb.weight, std=emb_std)
        for mod in self.modules():
            if isinstance(mod, nn.Linear) and mod.bias is not None:
                nn.init.zeros_(mod.bias)
        for layer, block in enumerate(self.blocks):
            deep = std / math.sqrt(2 * (layer + 1))
            attn, mlp = block.attn.core, block.mlp.core
            nn.init.trunc_normal_(attn.c_attn.weight, std=std)  # q, k, v
            nn.init.trunc_normal_(attn.c_proj.weight, std=deep)
            if mlp.kind == "swiglu":
                up, gate = mlp.c_fc.weight.chunk(2, dim=0)
                nn.init.trunc_normal_(gate, std=std)
                nn.init.trunc_normal_(up, std=deep)
            else:  # the single up-projection: initialised as the gate (std), the first map of the FFN
                nn.init.trunc_normal_(mlp.c_fc.weight, std=std)
            nn.init.trunc_normal_(mlp.c_proj.weight, std=deep)
        head = d**-0.5
        nn.init.trunc_normal_(self.lm_head.weight, std=head, a=-3 * head, b=3 * head)
