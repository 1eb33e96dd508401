"""A GPT decoder whose norm placement is data (see placement.py).

Shape follows karpathy/nanoGPT model.py (names c_attn, c_proj, c_fc, wte, wpe,
ln_f, lm_head); attention is ``F.scaled_dot_product_attention`` (causal).
With ``arch=pre_ln norm=layernorm model.pos=learned model.mlp=gelu
model.bias=true model.tie_embeddings=true`` it computes exactly nanoGPT's GPT
(tests/test_model.py checks logits against nanoGPT's equations).

Init (docs/architectures.md §5):
- all Linear/Embedding N(0, model.init_std); biases 0. ``model.init_std: auto`` (the default) is
  GPT-2's 0.02 carried to this width at GPT-2's gain, 0.02 * sqrt(768 / d) (config/schema.init_std_of,
  docs/init.md): the same for every norm, so a norm comparison starts from one init. DeepNorm's
  xavier matrices keep theirs.
- ``arch.scaled_init``: attention and MLP output projections std/sqrt(2L) (GPT-2, nanoGPT).
- ``arch.tiny_init`` (Pangu Ultra's TinyInit, model/norm_sites.py): std sqrt(1/(2dL)), embedding 0.5.
- ``arch.small_init`` (hybridnorm): std = sqrt(2/(5d)), truncated at 3 std (OLMo "full_megatron").
  The untied LM head (if any) gets the same std (OLMo's full_megatron gives it d^-0.5; the
  HybridNorm recipe ties embeddings, so this does not arise there).
- ``model.param=mup``/``completep`` (model/mup.py, docs/mup.md): each hidden matrix at the rule at d_base times
  sqrt(fan_in_base / fan_in), its own fan-in ratio; the embedding and the readout at d_base's std. At d_base
  each Linear is drawn once with SP's std, so muP there is SP bit for bit (tied or untied head).
- deepnorm: the paper's init, not torchscale's: xavier_normal(gain=beta) on the MLP
  matrices, v and the attention output; xavier_normal(gain=1) on q and k. Fused matrices are
  initialised per logical matrix (q, k, v rows of c_attn; the up and gate halves of a SwiGLU
  c_fc), each with its own fans, as separate Linear layers would be. Biases stay 0.
Attention, RoPE and the KV cache: model/attention.py.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from normbench.config.arch_traits import arch_traits
from normbench.config.schema import init_std_of
from normbench.model import mup
from normbench.model.attention import Attention, rope_cache
from normbench.model.kinds import norm_internal
from normbench.model.placement import BlockSpec, SublayerSpec, block_specs, deepnorm_beta
from normbench.norm.norms import EmbedScale, build_norm, offset_gain, upcast


class MLP(nn.Module):
    def __init__(self, d: int, d_ff: int, kind: str, bias: bool, mid_norm: nn.Module | None = None):
        super().__init__()
        self.kind = kind
        self.mid_norm = mid_norm  # NormFormer: a norm over d_ff after the activation, before c_proj
        self.c_fc = nn.Linear(d, 2 * d_ff if kind == "swiglu" else d_ff, bias=bias)
        self.c_proj = nn.Linear(d_ff, d, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
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


class Sublayer(nn.Module):
    """One residual sublayer with its norms placed as ``spec`` says (see placement.py)."""

    PARAM_KINDS = {"resid_scale": "scalar"}  # NormFormer's lambda (model/kinds.py)

    def __init__(self, spec: SublayerSpec, core: nn.Module, norm_cfg, d: int, site: str, dropout: float):
        super().__init__()
        self.spec = spec
        self.core = core
        self.norm_in = build_norm(norm_cfg, d, site) if spec.in_norm else None
        self.norm_out = build_norm(norm_cfg, d, site) if spec.out_norm else None
        if self.norm_out is not None and spec.out_gain != 1.0:  # depth-scaled sandwich: gain init c/sqrt(L)
            with torch.no_grad():
                self.norm_out.weight.fill_(spec.out_gain)
        self.in_scale = float(spec.in_scale)  # LNS 1/sqrt(l): a Python float, survives to_empty
        self.resid_scale = nn.Parameter(torch.ones(d)) if spec.resid_scale else None
        self.norm_post = build_norm(norm_cfg, d, site) if spec.post_norm else None
        self.resid_dropout = nn.Dropout(dropout) if dropout > 0 else None
        self.alpha = float(spec.alpha)  # a Python float: survives meta-device init / to_empty
        self.branch_scale = 1.0  # CompleteP's L_base / L on the branch (model/mup.py); set by the GPT

    def branch(self) -> list[nn.Module]:
        """The modules whose output ``branch_scale`` multiplies (their gradients carry CompleteP's L_base / L)."""
        return [m for m in (self.norm_in, self.core, self.norm_out) if m is not None]

    def residual_side(self) -> list[nn.Module]:
        """Norms whose output is this sublayer's output or the residual stream (their gains: ``norm_out``)."""
        side = [self.norm_out, self.norm_post] + ([self.norm_in] if self.spec.residual_after_norm else [])
        return [m for m in side if m is not None]

    def forward(self, x: torch.Tensor, *args) -> torch.Tensor:
        h = self.norm_in(x) if self.norm_in is not None else x
        if self.spec.residual_after_norm:
            x = h
        if self.in_scale != 1.0:
            h = h * self.in_scale
        y = self.core(h, *args)
        if self.norm_out is not None:
            y = self.norm_out(y)
        if self.resid_dropout is not None:
            y = self.resid_dropout(y)
        if self.branch_scale != 1.0:
            y = y * self.branch_scale
        if self.resid_scale is not None:
            x = x * self.resid_scale + y
        else:
            x = x + y if self.alpha == 1.0 else x * self.alpha + y
        return self.norm_post(x) if self.norm_post is not None else x


class LMHead(nn.Linear):
    """The output projection: an ``nn.Linear`` whose weight is of kind ``head`` (model/kinds.py)."""

    PARAM_KINDS = {"weight": "head", "bias": "bias"}


class Block(nn.Module):
    def __init__(self, spec: BlockSpec, mcfg, norm_cfg, d_ff: int, gate: str = "none"):
        super().__init__()
        d = mcfg.d_model
        attn = Attention(
            d,
            mcfg.n_head,
            mcfg.bias,
            mcfg.dropout,
            norm_cfg,
            spec.qk_norm,
            spec.v_norm,
            spec.qk_width,
            gate,
            spec.head_scale,
        )
        self.attn = Sublayer(spec.attn, attn, norm_cfg, d, "attn", mcfg.dropout)
        mid = build_norm(norm_cfg, d_ff, "ffn", d) if spec.mlp.mid_norm else None
        mlp = MLP(d, d_ff, mcfg.mlp, mcfg.bias, mid)  # dropout on both sublayer outputs, after any output norm
        self.mlp = Sublayer(spec.mlp, mlp, norm_cfg, d, "ffn", mcfg.dropout)

    def forward(self, x: torch.Tensor, rope, kv=None) -> torch.Tensor:
        return self.mlp(self.attn(x, rope) if kv is None else self.attn(x, rope, kv))


def default_d_ff(mcfg) -> int:
    if mcfg.d_ff:
        return mcfg.d_ff
    if mcfg.mlp == "swiglu":  # 8/3 d keeps the parameter count of a 4d GELU MLP (LLaMA)
        return 32 * math.ceil(8 * mcfg.d_model / 3 / 32)
    return 4 * mcfg.d_model


class CausalLM:
    """What GPT and nGPT share: the cached RoPE table and the parameter count.

    The RoPE table is rebuilt on first use (and on a device change), never stored in a
    buffer, so meta-device init / ``to_empty`` cannot wipe it (OLMo-core PR #698).
    """

    use_rope: bool
    seq_len: int
    head_dim: int
    rope_theta: float
    _rope: tuple[torch.Tensor, torch.Tensor] | None

    def rope(self, device, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The (cos, sin) table for weights of ``dtype``: fp32 for fp32/bf16 weights, fp64 for fp64."""
        if not self.use_rope:
            return None
        dtype = torch.promote_types(dtype, torch.float32)
        if self._rope is None or self._rope[0].device != device or self._rope[0].dtype != dtype:
            self._rope = rope_cache(self.seq_len, self.head_dim, self.rope_theta, device, dtype)
        return self._rope

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


class GPT(CausalLM, nn.Module):
    def __init__(self, mcfg, arch, norm_cfg, vocab_size: int):
        super().__init__()
        self.n_layer, self.d_model, self.vocab_size = mcfg.n_layer, mcfg.d_model, vocab_size
        d, L = mcfg.d_model, mcfg.n_layer
        self.specs = block_specs(arch, L)
        self.wte = nn.Embedding(vocab_size, d)
        self.wpe = nn.Embedding(mcfg.seq_len, d) if mcfg.pos == "learned" else None
        self.emb_scale = EmbedScale(d) if norm_cfg.embed_scale else None
        self.emb_norm = build_norm(norm_cfg, d, "embed") if arch.embed_norm else None
        self.drop = nn.Dropout(mcfg.dropout) if mcfg.dropout > 0 else nn.Identity()
        self.blocks = nn.ModuleList(self.make_block(i, s, mcfg, arch, norm_cfg) for i, s in enumerate(self.specs))
        self.ln_f = build_norm(norm_cfg, d, "final") if arch.final_norm else None
        self.lm_head = LMHead(d, vocab_size, bias=False)
        if mcfg.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        self.head_dim = d // mcfg.n_head
        self.rope_theta = mcfg.rope_theta
        self.use_rope = mcfg.pos == "rope"
        self.seq_len = mcfg.seq_len
        self.fixnorm = mcfg.fixnorm
        self._rope = None
        self.readout_mult = 1.0 / mup.width_mult(mcfg)  # muP's 1/m on the logits (1 under sp)
        if mup.depth_mult(mcfg) != 1.0:
            for sub in self.modules():
                if isinstance(sub, Sublayer):
                    sub.branch_scale = 1.0 / mup.depth_mult(mcfg)
        # muP off d_base: each Linear's fan_in in this model built at d_base (its init follows its own ratio)
        self.mup_fan_in_base = mup.base_fan_ins(lambda base: type(self)(base, arch, norm_cfg, vocab_size), mcfg)
        if not self.wte.weight.is_meta:  # a model of shapes only (validation's N and LRs) has no values to draw
            self._init_weights(mcfg, arch)
        if arch.gain_offset:  # Gemma: every norm gain stored as 1 + w, w = 0 at init
            gains = [m for m in self.modules() if getattr(type(m), "has_gain", False) and m.weight is not None]
            for mod in gains:
                offset_gain(mod)

    def make_block(self, index: int, spec: BlockSpec, mcfg, arch, norm_cfg) -> nn.Module:
        """Block ``index`` of the stack; a model whose blocks have their own geometry overrides this
        (model/simplegpt.py, normfree.py). Called once per block, before the weights are initialised."""
        return Block(spec, mcfg, norm_cfg, default_d_ff(mcfg), arch.attn_gate)

    # ----- init -----
    @staticmethod
    def init_std(mcfg, arch) -> float:
        """The std of the plain weight matrices and the embedding: the arch's own rule where its paper has one
        (Pangu Ultra's TinyInit, HybridNorm's small init), else ``model.init_std`` resolved at this width;
        under muP the rule at d_base times sqrt(d_base / d) (model/mup.py; the same for ``auto``).
        Each model class owns this rule; ``model.weight_init_std`` reports it."""
        if mup.active(mcfg):
            return mup.hidden_std(GPT._init_rule, mcfg, arch)
        return GPT._init_rule(mcfg, arch)

    @staticmethod
    def _init_rule(mcfg, arch) -> float:
        d, L = mcfg.d_model, mcfg.n_layer
        if arch.tiny_init:  # variance 1/(2dL), embedding std 0.5 (model/norm_sites.py)
            return math.sqrt(1.0 / (2.0 * d * L))
        if arch.small_init:
            return math.sqrt(2.0 / (5.0 * d))
        return init_std_of(mcfg.init_std, d)

    def _linear_stds(self, mcfg, arch) -> dict[int, float]:
        """muP's init std of each Linear (by id; {} under sp): the readout at d_base's std, and each hidden matrix
        at the rule at d_base times sqrt(fan_in_base / fan_in), its own fan-in ratio as its LR's (SwiGLU's
        c_proj grows 192 -> 704, not x4). At d_base every value is SP's std, so muP draws what SP draws."""
        if not mup.active(mcfg):
            return {}
        base, fan_in = mup.base_std(GPT._init_rule, mcfg, arch), self.mup_fan_in_base
        stds = {id(m): base * math.sqrt(fan_in[n] / m.in_features) for n, m in self.named_modules() if n in fan_in}
        stds[id(self.lm_head)] = base  # held at d_base's; a tied head is overwritten by the embedding below
        return stds

    def _init_weights(self, mcfg, arch) -> None:
        d, L = mcfg.d_model, mcfg.n_layer
        tiny = arch.tiny_init
        std, stds = self.init_std(mcfg, arch), self._linear_stds(mcfg, arch)
        emb_std = arch.embed_init_std if arch.embed_init_std is not None else (0.5 if tiny else std)
        if mup.active(mcfg) and arch.embed_init_std is None and not tiny:  # muP: constant in width
            emb_std = mup.base_std(GPT._init_rule, mcfg, arch)

        def normal(w: torch.Tensor, s: float) -> None:
            if arch.small_init:
                nn.init.trunc_normal_(w, std=s, a=-3 * s, b=3 * s)
            else:
                nn.init.normal_(w, std=s)

        inside = norm_internal(self)  # a norm's own layers keep the norm's init
        for mod in self.modules():
            if isinstance(mod, nn.Linear) and id(mod) not in inside:
                normal(mod.weight, stds.get(id(mod), std))  # one draw per Linear, the head's too
                if mod.bias is not None:
                    nn.init.zeros_(mod.bias)
        for mod in self.modules():  # after the Linears: a tied lm_head must not overwrite the embedding's init
            if isinstance(mod, nn.Embedding) and id(mod) not in inside:
                normal(mod.weight, emb_std)
        if arch_traits(arch.name).deepnorm_init:
            beta = arch.beta if arch.beta is not None else deepnorm_beta(L)
            for block in self.blocks:
                w_qkv = block.attn.core.c_attn.weight  # rows: q, k, v
                for i, gain in enumerate((1.0, 1.0, beta)):
                    nn.init.xavier_normal_(w_qkv[i * d : (i + 1) * d], gain=gain)
                nn.init.xavier_normal_(block.attn.core.c_proj.weight, gain=beta)
                # SwiGLU's c_fc stores two (d_ff, d) matrices [up; gate]: each gets its own xavier
                # fans and gain beta, as two FFN input matrices would (our choice: the paper has no
                # GLU, torchscale's GLU leaves its gate unscaled; see model/placement.py)
                w_fc = block.mlp.core.c_fc.weight
                halves = w_fc.chunk(2, dim=0) if block.mlp.core.kind == "swiglu" else (w_fc,)
                for w in halves:
                    nn.init.xavier_normal_(w, gain=beta)
                nn.init.xavier_normal_(block.mlp.core.c_proj.weight, gain=beta)
        elif arch.scaled_init and getattr(mcfg, "param", "sp") != "completep":  # CompleteP: no 1/sqrt(2L)
            for block in self.blocks:
                for proj in (block.attn.core.c_proj, block.mlp.core.c_proj):
                    normal(proj.weight, stds.get(id(proj), std) / math.sqrt(2 * L))

    # ----- forward -----

    def embed(self, idx: torch.Tensor, start: int = 0) -> torch.Tensor:
        if self.fixnorm:  # FixNorm (Nguyen & Salazar 2019): unit-L2 word embeddings times sqrt(d)
            x = F.embedding(idx, F.normalize(self.wte.weight, dim=-1)) * math.sqrt(self.d_model)
        else:
            x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(start, start + idx.shape[1], device=idx.device))
        if self.emb_scale is not None:
            x = self.emb_scale(x)
        if self.emb_norm is not None:
            x = self.emb_norm(x)
        return self.drop(x)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, hidden: list | None = None, cache=None):
        """Logits (B, T, V) and the mean cross-entropy if ``targets`` is given.

        ``hidden``: a list that receives the residual stream after the embedding and
        after each block (diagnostics); None in training, so no extra work is done.
        ``cache``: a :class:`KVCache` (sampling): ``idx`` continues the tokens it holds.
        """
        rope = self.rope(idx.device, self.wte.weight.dtype)
        x = self.embed(idx) if cache is None else self.embed(idx, cache.length)
        if hidden is not None:
            hidden.append(x)
        for i, block in enumerate(self.blocks):
            x = block(x, rope) if cache is None else block(x, rope, cache.layers[i])
            if hidden is not None:
                hidden.append(x)
        if self.ln_f is not None:
            x = self.ln_f(x)
        if self.fixnorm and self.lm_head.weight is self.wte.weight:  # tied: the head uses the unit-norm rows
            logits = F.linear(x, F.normalize(self.lm_head.weight, dim=-1))
        else:
            logits = self.lm_head(x)
        if self.readout_mult != 1.0:
            logits = logits * self.readout_mult
        loss = None
        if targets is not None:
            loss = F.cross_entropy(upcast(logits).view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss

    def after_step(self) -> None:
        """Called after every optimizer step (nGPT re-normalizes weights here)."""
