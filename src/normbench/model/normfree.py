"""Norm-free residual GPTs: ReZero, Fixup and T-Fixup (no norm layer anywhere, no final norm).

Equations and deviations: docs/architectures.md §8 (8.2-8.4; what ``norm=`` means here: 8.5).

Each block keeps the GPT attention and MLP (``model.mlp``, RoPE, causal SDPA) and drops every norm;
what replaces them is a residual scale or a depth-scaled init:

- ``rezero`` (Bachlechner et al. 2020, arXiv:2003.04887; majumderb/rezero rezero/transformer/rztx.py
  ``RZTXDecoderLayer`` @ e2c94a8): ``h = x + a_l A(x)``, ``x' = h + a_l F(h)`` with ONE learnable
  scalar ``a_l`` per block, initialised 0, shared by the block's two sublayers as the reference's
  ``resweight`` (the paper's equation has one per residual). At init every block is the identity.
  Weights and embedding N(0, d^-1/2): the reference leaves them at torch's defaults (xavier for the
  fused q/k/v, std (2d)^-1/2; Linear std (3 fan_in)^-1/2), which this matches in scale.
- ``fixup`` (Zhang et al. 2019, arXiv:1901.09321; the transformer port hongyi-zhang/Fixup
  fairseq/fairseq/models/transformer_zero.py, modules/multihead_attention_zero.py @ f3fa449)::

      h  = x + s_A * A(x - b_A)
      x' = h + s_F * W_down(act(W_up(h - b_F) - b_1) - b_2)
      logits = W_head(x_L - b_out)

  scalar shifts ``b`` (init 0, subtracted) and scalar scales ``s`` (init 1). Init with
  ``M = 2L`` residual branches (the reference counts 2 per encoder and 3 per decoder layer; a
  decoder-only GPT has two): q/k/v xavier-uniform over the fused (3d, d) matrix times ``M^(-1/6)``,
  the attention output projection 0; W_up xavier-uniform times ``M^(-1/2)``, W_down 0; token
  embedding N(0, d^-1/2), multiplied by sqrt(d) in the forward; an untied head 0.
- ``tfixup`` (Huang et al. 2020, ICML; layer6ai-labs/T-Fixup fairseq/modules/transformer_layer.py
  ``TransformerDecoderLayer.fixup_initialization``, modules/multihead_attention.py @ b17e166): plain
  ``x + A(x)``, ``h + F(h)``; after fairseq's standard init (xavier-uniform; q, k, v with gain
  1/sqrt(2)) the decoder rule for ``L`` layers: W_up, W_down and the attention output times
  ``(9L)^(-1/4)``, v times ``(9L)^(-1/4) sqrt(2)``, q and k unchanged; token embedding
  N(0, d^-1/2) times ``(9L)^(-1/4)`` and times sqrt(d) in the forward; an untied head N(0, d^-1/2).

Deviations, on purpose:
- Fixup/T-Fixup are defined for ReLU FFNs. With ``model.mlp=swiglu`` (the default) the two halves
  of W_up (up and gate) are initialised as two FFN input matrices, each with its own xavier fans and
  the same factor; Fixup's shift ``b_1`` is subtracted from both halves before the activation.
- Fixup's LM arch forces a final LayerNorm ("training is not stable without"): that is a different
  model (a norm), so here there is none, as in its MT decoder; its output shift ``b_out`` is kept.
- T-Fixup's MT recipe (lr 5e-4, no warmup) is a recipe, not forced: ``sched.warmup_steps=0`` gives it.
- ``norm=`` has nothing to place and is ignored with a start-up note (as for nGPT); the norms that
  would add one (``arch.qk_norm``, ``arch.final_norm``, ``arch.embed_norm``) are refused.
Init constants are recomputed from the config (no buffers), so meta-device init cannot lose them.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn as nn

from normbench.config.arch_traits import arch_traits
from normbench.model.attention import Attention
from normbench.model.gpt import GPT, MLP, default_d_ff
from normbench.model.placement import BlockSpec, SublayerSpec, register_placement


def _no_norm_specs(arch, n_layer: int) -> list[BlockSpec]:
    return [BlockSpec(SublayerSpec(), SublayerSpec())] * n_layer


# What every norm-free arch declares (config/arch_traits.py ArchTraits): its own model class and init, no norm layer
_NORM_FREE = {
    "model": "normfree",
    "needs_norm": False,
    "ignores_norm": True,
    "own_init": "its model class has its own init (the paper's depth rule)",
}
register_placement("rezero", **_NORM_FREE)(_no_norm_specs)
register_placement("fixup", sets_embed_scale=True, **_NORM_FREE)(_no_norm_specs)
register_placement("tfixup", sets_embed_scale=True, **_NORM_FREE)(_no_norm_specs)


def fixup_branches(n_layer: int) -> int:
    """Fixup's M for a decoder-only GPT: two residual branches (attention, MLP) per block."""
    return 2 * n_layer


def tfixup_factor(n_layer: int) -> float:
    """T-Fixup's decoder scale (9L)^(-1/4)."""
    return (9 * n_layer) ** -0.25


class FixupMLP(MLP):
    """The GPT MLP with Fixup's two inner scalar shifts: before the activation and before W_down."""

    PARAM_KINDS = {"shift_act": "scalar", "shift_proj": "scalar"}

    def __init__(self, d: int, d_ff: int, kind: str, bias: bool):
        super().__init__(d, d_ff, kind, bias)
        self.shift_act = nn.Parameter(torch.zeros(1))
        self.shift_proj = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.c_fc(x) - self.shift_act
        if self.kind == "swiglu":
            up, gate = h.chunk(2, dim=-1)
            h = up * nn.functional.silu(gate)
        else:
            h = nn.functional.gelu(h) if self.kind == "gelu" else nn.functional.relu(h)
        return self.c_proj(h - self.shift_proj)


class Branch(nn.Module):
    """One residual branch without norms: ``scale * f(x - shift)`` (Fixup) or ``f(x)``.

    It has the attribute names diagnostics read on a :class:`~normbench.model.gpt.Sublayer`
    (``core``; ``norm_in``/``norm_out``/``norm_post``, all None) but does not add the residual:
    the block does, with ReZero's shared scalar where there is one.
    """

    PARAM_KINDS = {"shift": "scalar", "scale": "scalar"}
    norm_in = norm_out = norm_post = None

    def __init__(self, core: nn.Module, dropout: float, fixup: bool):
        super().__init__()
        self.core = core
        self.resid_dropout = nn.Dropout(dropout) if dropout > 0 else None
        self.shift = nn.Parameter(torch.zeros(1)) if fixup else None
        self.scale = nn.Parameter(torch.ones(1)) if fixup else None

    def forward(self, x: torch.Tensor, *args) -> torch.Tensor:
        y = self.core(x - self.shift if self.shift is not None else x, *args)
        if self.resid_dropout is not None:
            y = self.resid_dropout(y)
        return y * self.scale if self.scale is not None else y


class NormFreeBlock(nn.Module):
    PARAM_KINDS = {"resweight": "scalar"}

    def __init__(self, kind: str, mcfg, d_ff: int):
        super().__init__()
        d, fixup = mcfg.d_model, kind == "fixup"
        attn = Attention(d, mcfg.n_head, mcfg.bias, mcfg.dropout, None, qk_norm=False, v_norm=False)
        mlp = (FixupMLP if fixup else MLP)(d, d_ff, mcfg.mlp, mcfg.bias)
        self.attn, self.mlp = Branch(attn, mcfg.dropout, fixup), Branch(mlp, mcfg.dropout, fixup)
        self.resweight = nn.Parameter(torch.zeros(1)) if kind == "rezero" else None  # ReZero's alpha, init 0

    def forward(self, x: torch.Tensor, rope, kv=None) -> torch.Tensor:
        a = self.attn(x, rope) if kv is None else self.attn(x, rope, kv)
        x = x + (self.resweight * a if self.resweight is not None else a)
        f = self.mlp(x)
        return x + (self.resweight * f if self.resweight is not None else f)


class OutputShift(nn.Module):
    """Fixup's scalar shift on the last hidden state, before the LM head (the decoder's ``shift0``)."""

    PARAM_KINDS = {"shift": "scalar"}

    def __init__(self):
        super().__init__()
        self.shift = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x - self.shift


def _xavier_rows(w: torch.Tensor, parts: int, gain: float = 1.0) -> None:
    """xavier-uniform on each of ``parts`` equal row blocks of ``w``, each with its own fans."""
    for block in w.chunk(parts, dim=0):
        nn.init.xavier_uniform_(block, gain=gain)


class NormFreeGPT(GPT):
    """GPT with norm-free blocks and the ReZero / Fixup / T-Fixup init (module docstring)."""

    def __init__(self, mcfg, arch, norm_cfg, vocab_size: int):
        no_norm = copy.deepcopy(norm_cfg)  # norm= is ignored (start-up note): nothing here is a norm
        no_norm.name, no_norm.embed_scale = "none", False
        super().__init__(mcfg, arch, no_norm, vocab_size)
        self.kind = arch.name
        self.embed_mult = math.sqrt(mcfg.d_model) if arch_traits(self.kind).sets_embed_scale else 1.0
        self.ln_f = OutputShift() if self.kind == "fixup" else None

    def make_block(self, index: int, spec: BlockSpec, mcfg, arch, norm_cfg) -> nn.Module:
        return NormFreeBlock(arch.name, mcfg, default_d_ff(mcfg))

    def embed(self, idx: torch.Tensor, start: int = 0) -> torch.Tensor:
        if self.embed_mult == 1.0:
            return super().embed(idx, start)
        x = self.wte(idx) * self.embed_mult  # fairseq: sqrt(d) * embed_tokens(x) + positions
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(start, start + idx.shape[1], device=idx.device))
        return self.drop(x)

    @staticmethod
    def init_std(mcfg, arch) -> float:
        """fairseq's base std d^-1/2, whatever ``model.init_std`` says (the papers' init sets every weight)."""
        return mcfg.d_model**-0.5

    @torch.no_grad()
    def _init_weights(self, mcfg, arch) -> None:
        L, kind = mcfg.n_layer, arch.name
        base = self.init_std(mcfg, arch)
        for mod in self.modules():
            if isinstance(mod, nn.Linear):
                nn.init.normal_(mod.weight, std=base)
                if mod.bias is not None:
                    nn.init.zeros_(mod.bias)
        for emb in (self.wte, self.wpe):  # fairseq: N(0, d^-1/2) for tokens and learned positions
            if emb is not None:
                nn.init.normal_(emb.weight, std=base)
        if kind == "rezero":
            return
        untied = self.lm_head.weight is not self.wte.weight
        for block in self.blocks:
            attn, mlp = block.attn.core, block.mlp.core
            halves = 2 if mlp.kind == "swiglu" else 1
            if kind == "fixup":
                m = fixup_branches(L)
                nn.init.xavier_uniform_(attn.c_attn.weight)  # the fused (3d, d) in_proj, as the reference
                attn.c_attn.weight.mul_(m ** (-1 / 6))
                nn.init.zeros_(attn.c_proj.weight)
                _xavier_rows(mlp.c_fc.weight, halves)
                mlp.c_fc.weight.mul_(m**-0.5)
                nn.init.zeros_(mlp.c_proj.weight)
            else:  # tfixup: fairseq's init, then the decoder rescaling
                c = tfixup_factor(L)
                q, k, v = attn.c_attn.weight.chunk(3, dim=0)
                nn.init.xavier_uniform_(q, gain=2**-0.5)
                nn.init.xavier_uniform_(k, gain=2**-0.5)
                nn.init.xavier_uniform_(v, gain=2**-0.5)
                v.mul_(c * 2**0.5)
                for w in (attn.c_proj.weight, mlp.c_proj.weight):
                    nn.init.xavier_uniform_(w)
                    w.mul_(c)
                _xavier_rows(mlp.c_fc.weight, halves)
                mlp.c_fc.weight.mul_(c)
        if kind == "tfixup":
            self.wte.weight.mul_(tfixup_factor(L))  # after the head's init: a tied head is this matrix
        elif untied:
            nn.init.zeros_(self.lm_head.weight)  # Fixup: the untied output embedding starts at 0
