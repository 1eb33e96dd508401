"""nGPT, the normalized Transformer (Loshchilov et al. 2024, arXiv:2410.01131).

Reference code: NVIDIA/ngpt model.py and train.py @ ed19eb2 (docs/architectures.md §4).
Every vector lives on the unit hypersphere: embeddings, hidden states, and the
rows/columns of every matrix along the embedding dimension d. Each block moves
the hidden state toward the normalized sublayer output with per-dimension
"eigen learning rates" alpha::

    h <- Norm( Norm(h) + |alpha_A| * (Norm(attn(h)) - Norm(h)) )
    h <- Norm( Norm(h) + |alpha_M| * (Norm(mlp(h))  - Norm(h)) )

Scale vectors use the reference's "stored value x (init/scale)" parametrization:
a vector is stored at ``scale`` and used as ``param * init / scale``, so its
effective value starts at ``init`` while Adam sees a parameter of size ``scale``.

Deviations from the reference, on purpose:
- Standard rotate-half RoPE (the reference's rotary is not a true rotation, NVIDIA/ngpt#10).
- L2 normalizations use ``F.normalize`` in at least fp32 (fp64 for fp64 weights) with an eps (the
  reference has no eps, NVIDIA/ngpt#7); in eager fp32 on CPU its bit-identical lean backward
  (:mod:`normbench.norm.lean_grads`).
- Weights are fp32 masters (the reference stores Linear weights in bf16).
- As the reference code (not the paper, which rescales only v): both SwiGLU halves u and v are
  multiplied by ``s_uv * sqrt(d)``; the factor on u is removed by the normalization after the MLP.
- No weight decay and no warmup, whatever ``optim``/``sched`` say (a start-up note says so).
- Like the reference, always RoPE and SwiGLU (c_fc: d -> 2 * 4d), no biases, no dropout, untied
  head: ``model.pos/mlp/bias/dropout/tie_embeddings`` are ignored with a start-up note
  (:func:`normbench.model.check_combination`).
The weight re-projection (:meth:`NGPT.normalize_matrices`) runs under no_grad in
fp32 after every optimizer step, outside any compiled graph (the trainer calls
``model.after_step()``). ``norm=`` is ignored: nGPT has no LayerNorm/RMSNorm.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from normbench.config.arch_traits import register_arch
from normbench.model.attention import apply_rope, cached_attention, record_attention_stats, sdpa
from normbench.model.gpt import CausalLM, LMHead
from normbench.norm.lean_grads import l2_normalize
from normbench.norm.norms import upcast

# arch=ngpt: no placement but this model (config/arch_traits.py ArchTraits says who reads each trait)
register_arch(
    "ngpt",
    model="ngpt",
    needs_norm=False,
    ignores_norm=True,
    unit_norm_geometry=True,
    own_init="nGPT is its own normalized parametrization (unit-norm weights, its s/alpha scales; model/ngpt.py)",
    extra_norms=10,  # ten L2 normalisations per layer
    own_mlp="swiglu",
)


class ScaledVector(nn.Module):
    """A learnable vector stored at ``scale`` and used as ``param * init / scale``."""

    PARAM_KINDS = {"param": "scalar"}  # model/kinds.py

    def __init__(self, dim: int, init: float, scale: float):
        super().__init__()
        self.init, self.scale = float(init), float(scale)
        self.param = nn.Parameter(torch.full((dim,), self.scale))

    def forward(self) -> torch.Tensor:
        factor = self.init / self.scale
        # a factor of exactly 1 (s_uv): the product is the parameter itself, bit for bit, one op fewer
        return self.param if factor == 1.0 else self.param * factor


class NGPTBlock(nn.Module):
    def __init__(self, d: int, n_head: int, d_ff: int, arch):
        super().__init__()
        self.n_head, self.head_dim, self.d = n_head, d // n_head, d
        self.eps = arch.norm_eps
        base = 1.0 / math.sqrt(d)
        self.c_attn = nn.Linear(d, 3 * d, bias=False)  # rows of q, k, v: unit norm in R^d
        self.att_c_proj = nn.Linear(d, d, bias=False)  # columns: unit norm in R^d
        self.c_fc = nn.Linear(d, 2 * d_ff, bias=False)  # rows of u and v
        self.mlp_c_proj = nn.Linear(d_ff, d, bias=False)  # columns
        self.attn_alpha = ScaledVector(d, arch.alpha_init, base)
        self.mlp_alpha = ScaledVector(d, arch.alpha_init, base)
        self.sqk = ScaledVector(d, arch.s_qk_init, base)
        self.suv = ScaledVector(2 * d_ff, arch.s_uv_init, 1.0)
        self.stats = None  # attention statistics for diagnostics
        self.sdpa_fp32 = False  # set by build_model from ``attn_fp32`` (attention.sdpa)

    def norm(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:  # the casts below are no-ops in fp32: skip their dispatch
            return l2_normalize(x, self.eps)
        return F.normalize(upcast(x), dim=-1, eps=self.eps).type_as(x)

    def forward(self, h: torch.Tensor, rope, kv=None) -> torch.Tensor:
        B, T, C = h.shape
        pos = 0 if kv is None else kv.length  # sampling with a KV cache (see attention.KVCache)
        q, k, v = self.c_attn(h).view(B, T, 3, self.n_head, self.head_dim).unbind(2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T, hd)
        if rope is not None:  # RoPE before the q/k normalization (reference order)
            cos, sin = rope
            cos, sin = cos[pos : pos + T], sin[pos : pos + T]
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        sqk = self.sqk().view(1, self.n_head, 1, self.head_dim)
        q, k = sqk * self.norm(q), sqk * self.norm(k)
        scale = math.sqrt(self.head_dim)  # unit q, k: softmax scale +sqrt(d_h), not 1/sqrt(d_h)
        if kv is None:
            y = sdpa(q, k, v, self.sdpa_fp32, is_causal=True, scale=scale)
        else:
            k, v = kv.update(k, v)
            y = cached_attention(q, k, v, scale=scale)
        if self.stats is not None:
            record_attention_stats(self.stats, q, k, scale)
        h_att = self.att_c_proj(y.transpose(1, 2).reshape(B, T, C))
        h = self._lerp(h, h_att, self.attn_alpha())

        uv = self.c_fc(h) * (self.suv() * math.sqrt(self.d))
        u, v = uv.chunk(2, dim=-1)
        h_mlp = self.mlp_c_proj(u * F.silu(v))
        return self._lerp(h, h_mlp, self.mlp_alpha())

    def _lerp(self, h: torch.Tensor, out: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        h_norm, out_norm = self.norm(h), self.norm(out)
        return self.norm(h_norm + alpha.abs() * (out_norm - h_norm))


class NGPT(CausalLM, nn.Module):
    @staticmethod
    def init_std(mcfg, arch) -> float:
        """The reference's 1/sqrt(d) draw, before every row is projected onto the unit sphere."""
        return 1.0 / math.sqrt(mcfg.d_model)

    def __init__(self, mcfg, arch, vocab_size: int):
        super().__init__()
        d, L = mcfg.d_model, mcfg.n_layer
        self.n_layer, self.d_model, self.vocab_size = L, d, vocab_size
        self.eps = arch.norm_eps
        d_ff = mcfg.d_ff or 4 * d  # reference: c_fc maps d -> 2 * 4d
        self.wte = nn.Embedding(vocab_size, d)
        self.blocks = nn.ModuleList(NGPTBlock(d, mcfg.n_head, d_ff, arch) for _ in range(L))
        self.lm_head = LMHead(d, vocab_size, bias=False)  # never tied
        self.sz = ScaledVector(vocab_size, arch.s_z_init, 1.0 / math.sqrt(d))
        self.head_dim, self.rope_theta, self.seq_len = d // mcfg.n_head, mcfg.rope_theta, mcfg.seq_len
        self.use_rope = True  # the reference always uses RoPE; model.pos=learned is ignored (start-up note)
        self._rope = None
        if not self.wte.weight.is_meta:  # a model of shapes only (validation's N and LRs) has no values to draw
            self._init_weights(mcfg, arch)

    def _init_weights(self, mcfg, arch) -> None:
        base, L = self.init_std(mcfg, arch), mcfg.n_layer
        for mod in self.modules():
            if isinstance(mod, (nn.Linear, nn.Embedding)):
                nn.init.normal_(mod.weight, std=base)
        for block in self.blocks:
            for proj in (block.att_c_proj, block.mlp_c_proj):
                nn.init.normal_(proj.weight, std=base / math.sqrt(2 * L))
        self.normalize_matrices()

    def matrices(self) -> list[tuple[nn.Parameter, int]]:
        """Every matrix with the dim along which its vectors in R^d lie (train.py L388-411)."""
        out = [(self.wte.weight, 1), (self.lm_head.weight, 1)]
        for b in self.blocks:
            out += [(b.c_attn.weight, 1), (b.c_fc.weight, 1), (b.att_c_proj.weight, 0), (b.mlp_c_proj.weight, 0)]
        return out

    @torch.no_grad()
    def normalize_matrices(self) -> None:
        for w, dim in self.matrices():
            # in place, the same division F.normalize does: no copy. Not for FSDP2's DTensor shards: a norm over
            # the sharded dim is a partial sum that in-place ops cannot keep (the copy redistributes it)
            if w.dtype == torch.float32 and type(w.data) is torch.Tensor:
                w.div_(w.norm(2, dim, keepdim=True).clamp_min_(self.eps))
            else:
                w.copy_(F.normalize(upcast(w), dim=dim, eps=self.eps).to(w.dtype))

    def after_step(self) -> None:
        self.normalize_matrices()

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, hidden: list | None = None, cache=None):
        rope = self.rope(idx.device, self.wte.weight.dtype)
        h = self.wte(idx)  # rows are unit norm already
        if hidden is not None:
            hidden.append(h)
        for i, block in enumerate(self.blocks):
            h = block(h, rope) if cache is None else block(h, rope, cache.layers[i])
            if hidden is not None:
                hidden.append(h)
        logits = self.sz() * self.lm_head(h)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(upcast(logits).view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss
