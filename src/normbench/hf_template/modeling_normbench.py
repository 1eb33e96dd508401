"""A normbench decoder as a transformers ``PreTrainedModel`` (load with ``trust_remote_code=True``).

Written into the export directory by ``python -m normbench export``; self-contained (torch and
transformers only). It recomputes normbench's model (github: normbench, src/normbench/model/)
with the same parameter names, so the exported weights are normbench's state dict unchanged:

- Every softmax-attention placement is one block whose two sublayers compute, for a sublayer f,
  ``h = N_in(x) or x; x = h if residual_after_norm; y = N_out(f(h * in_scale)) or f(h * in_scale);
  x' = N_post(lambda*x + y) or lambda*x + y`` with lambda the scalar ``alpha`` or a learned vector
  ``resid_scale`` (Pre-LN, Post-LN, Peri-LN, Mix-LN, HybridNorm(*), DeepNorm, LNS's 1/sqrt(l), OLMo 2's
  reordered norms, sandwich, NormFormer differ only in these flags, listed per block in the config).
  Per block also: q/k norms per head or over the whole width (OLMo 2), a v norm, a sigmoid gate on
  the attention output (per head or per element, arXiv:2505.06708), NormFormer's head scale and FFN
  norm over d_ff.
- Norms (norms_normbench.py): LayerNorm, RMSNorm, DyT, Derf, ScaleNorm, CRMSNorm, SeeDNorm,
  BatchNorm and PowerNorm (running statistics), or none; computed in the model's dtype (fp64 when
  cast to float64), statistics in at least fp32.
- FixNorm (arXiv:1910.05895): unit-L2 embedding rows times sqrt(d), and a tied head of unit rows.
- SimpleGPT (arXiv:2602.01212): the same sublayers with a norm after every linear map inside them
  and none around them (layers_normbench.py). ReZero, Fixup, T-Fixup (arXiv:2003.04887,
  1901.09321; Huang et al. 2020): blocks without norms, ``x + a_l f(x)`` or ``x + s f(x - b)``.
- nGPT (Loshchilov et al. 2024, arXiv:2410.01131; NVIDIA/ngpt): unit-norm hidden states, eigen
  learning rates; scale vectors are used as ``param * multiplier`` (the multipliers are in the config).
- muP (Yang et al. 2022, arXiv:2203.03466): the logits times ``logit_scale`` (1/m) where the config has one;
  CompleteP (arXiv:2505.01618): each sublayer's output times its ``branch_scale`` (L_base / L).
- RoPE is rotate-half (GPT-NeoX/LLaMA), applied after any q/k norm (nGPT: before its q/k L2 norm);
  its table is computed in the weights' dtype promoted to fp32.
The KV cache is transformers' own ``Cache`` (``generate`` works); attention is
``F.scaled_dot_product_attention``.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
import transformers
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_normbench import NormbenchConfig
from .layers_normbench import (
    MLP,
    Attention,
    FixupMLP,
    SimpleAttention,
    SimpleMLP,
    apply_rope,
    attend,
    causal_mask,
    rope,
)
from .norms_normbench import build_norm, upcast

_V5 = int(transformers.__version__.split(".")[0]) >= 5
# transformers 5 names the cache `cache` (4.x: `past_key_values`), in outputs and in forward
_CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


class EmbedScale(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


class Sublayer(nn.Module):
    """One residual sublayer with its norms placed as the block spec says (see the module docstring)."""

    def __init__(self, config: NormbenchConfig, spec: dict, core: nn.Module):
        super().__init__()
        d = config.hidden_size
        self.core = core
        self.norm_in = build_norm(config.norm, d) if spec.get("in_norm") else None
        self.norm_out = build_norm(config.norm, d) if spec.get("out_norm") else None
        self.norm_post = build_norm(config.norm, d) if spec.get("post_norm") else None
        self.residual_after_norm = bool(spec.get("residual_after_norm", False))
        self.in_scale = float(spec.get("in_scale", 1.0))
        self.alpha = float(spec.get("alpha", 1.0))
        self.branch_scale = float(spec.get("branch_scale", 1.0))  # CompleteP: L_base / L on the branch
        self.resid_scale = nn.Parameter(torch.ones(d)) if spec.get("resid_scale") else None
        self.resid_dropout = nn.Dropout(config.dropout) if config.dropout > 0 else None

    def forward(self, x: torch.Tensor, ctx: dict) -> torch.Tensor:
        h = self.norm_in(x) if self.norm_in is not None else x
        if self.residual_after_norm:
            x = h
        if self.in_scale != 1.0:
            h = h * self.in_scale
        y = self.core(h, ctx)
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


class Block(nn.Module):
    """A GPT block; ``spec["simple"]``: SimpleGPT's sublayers (their norms inside, none around them)."""

    def __init__(self, config: NormbenchConfig, spec: dict):
        super().__init__()
        if spec.get("simple"):
            attn, mlp = SimpleAttention(config), SimpleMLP(config)
        else:
            attn, mlp = Attention(config, spec), MLP(config, spec["mlp"].get("mid_norm", False))
        self.attn = Sublayer(config, spec["attn"], attn)
        self.mlp = Sublayer(config, spec["mlp"], mlp)

    def forward(self, x: torch.Tensor, ctx: dict) -> torch.Tensor:
        return self.mlp(self.attn(x, ctx), ctx)


class Branch(nn.Module):
    """A norm-free residual branch: ``scale * f(x - shift)`` (Fixup) or ``f(x)``; the block adds it."""

    def __init__(self, config: NormbenchConfig, core: nn.Module, fixup: bool):
        super().__init__()
        self.core = core
        self.resid_dropout = nn.Dropout(config.dropout) if config.dropout > 0 else None
        self.shift = nn.Parameter(torch.zeros(1)) if fixup else None
        self.scale = nn.Parameter(torch.ones(1)) if fixup else None

    def forward(self, x: torch.Tensor, ctx: dict) -> torch.Tensor:
        y = self.core(x - self.shift if self.shift is not None else x, ctx)
        if self.resid_dropout is not None:
            y = self.resid_dropout(y)
        return y * self.scale if self.scale is not None else y


class NormFreeBlock(nn.Module):
    """ReZero (``x + a_l f(x)``, one scalar per block), Fixup or T-Fixup (plain ``x + f(x)``): no norm."""

    def __init__(self, config: NormbenchConfig, kind: str):
        super().__init__()
        fixup, plain = kind == "fixup", {"qk_norm": False, "v_norm": False}
        self.attn = Branch(config, Attention(config, plain), fixup)
        self.mlp = Branch(config, FixupMLP(config) if fixup else MLP(config), fixup)
        self.resweight = nn.Parameter(torch.zeros(1)) if kind == "rezero" else None

    def forward(self, x: torch.Tensor, ctx: dict) -> torch.Tensor:
        a = self.attn(x, ctx)
        x = x + (self.resweight * a if self.resweight is not None else a)
        f = self.mlp(x, ctx)
        return x + (self.resweight * f if self.resweight is not None else f)


class OutputShift(nn.Module):
    """Fixup's scalar shift of the last hidden state, before the LM head."""

    def __init__(self):
        super().__init__()
        self.shift = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x - self.shift


# ----------------------------------------------------------------------------- nGPT
class ScaledVector(nn.Module):
    def __init__(self, dim: int, multiplier: float):
        super().__init__()
        self.multiplier = float(multiplier)
        self.param = nn.Parameter(torch.ones(dim))

    def forward(self) -> torch.Tensor:
        return self.param * self.multiplier


class NGPTBlock(nn.Module):
    def __init__(self, config: NormbenchConfig, mult: dict):
        super().__init__()
        d, self.n_head = config.hidden_size, config.num_attention_heads
        self.head_dim, self.d, d_ff = d // self.n_head, d, config.intermediate_size
        self.eps = config.ngpt["eps"]
        self.c_attn = nn.Linear(d, 3 * d, bias=False)
        self.att_c_proj = nn.Linear(d, d, bias=False)
        self.c_fc = nn.Linear(d, 2 * d_ff, bias=False)
        self.mlp_c_proj = nn.Linear(d_ff, d, bias=False)
        self.attn_alpha = ScaledVector(d, mult["attn_alpha"])
        self.mlp_alpha = ScaledVector(d, mult["mlp_alpha"])
        self.sqk = ScaledVector(d, mult["sqk"])
        self.suv = ScaledVector(2 * d_ff, mult["suv"])

    def norm(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(upcast(x), dim=-1, eps=self.eps).type_as(x)

    def forward(self, h: torch.Tensor, ctx: dict) -> torch.Tensor:
        B, T, C = h.shape
        q, k, v = self.c_attn(h).view(B, T, 3, self.n_head, self.head_dim).unbind(2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        cos, sin = ctx["rope"]  # RoPE before the q/k normalization (reference order)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        sqk = self.sqk().view(1, self.n_head, 1, self.head_dim)
        q, k = sqk * self.norm(q), sqk * self.norm(k)
        if ctx["cache"] is not None:
            k, v = ctx["cache"].update(k, v, ctx["layer"])
        y = attend(q, k, v, ctx["mask"], scale=math.sqrt(self.head_dim))
        h = self._lerp(h, self.att_c_proj(y.transpose(1, 2).reshape(B, T, C)), self.attn_alpha())
        u, v = (self.c_fc(h) * (self.suv() * math.sqrt(self.d))).chunk(2, dim=-1)
        return self._lerp(h, self.mlp_c_proj(u * F.silu(v)), self.mlp_alpha())

    def _lerp(self, h, out, alpha):
        h_norm, out_norm = self.norm(h), self.norm(out)
        return self.norm(h_norm + alpha.abs() * (out_norm - h_norm))


# ----------------------------------------------------------------------------- the model
class NormbenchForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = NormbenchConfig
    base_model_prefix = "normbench"
    supports_gradient_checkpointing = False
    _supports_sdpa = True
    _no_split_modules = ["Block", "NormFreeBlock", "NGPTBlock"]
    _tied_weights_keys = {"lm_head.weight": "wte.weight"} if _V5 else ["lm_head.weight"]

    def __init__(self, config: NormbenchConfig):
        super().__init__(config)
        d, V = config.hidden_size, config.vocab_size
        self.is_ngpt = config.ngpt is not None
        self.head_dim = d // config.num_attention_heads
        self.wte = nn.Embedding(V, d)
        if self.is_ngpt:
            self.blocks = nn.ModuleList(NGPTBlock(config, m) for m in config.ngpt["blocks"])
            self.sz = ScaledVector(V, config.ngpt["sz"])
        else:
            self.wpe = nn.Embedding(config.max_position_embeddings, d) if config.position == "learned" else None
            self.emb_scale = EmbedScale() if config.embed_scale else None
            self.emb_norm = build_norm(config.norm, d) if config.embed_norm else None
            self.drop = nn.Dropout(config.dropout) if config.dropout > 0 else nn.Identity()
            free = (config.norm_free or {}).get("kind")
            self.embed_mult = float((config.norm_free or {}).get("embed_mult", 1.0))
            make = (lambda spec: NormFreeBlock(config, free)) if free else (lambda spec: Block(config, spec))
            self.blocks = nn.ModuleList(make(spec) for spec in config.blocks)
            self.ln_f = build_norm(config.final_norm_spec or config.norm, d) if config.final_norm else None
            if free == "fixup":
                self.ln_f = OutputShift()
        self.fixnorm = bool(getattr(config, "fixnorm", False))
        self.lm_head = nn.Linear(d, V, bias=False)
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:  # fresh models only; loading overwrites all
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    def get_input_embeddings(self) -> nn.Module:
        return self.wte

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.wte = value

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Module) -> None:
        self.lm_head = value

    def embed(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        if not self.is_ngpt and self.embed_mult != 1.0:  # Fixup/T-Fixup: sqrt(d) * embedding + positions
            x = self.wte(input_ids) * self.embed_mult
            return self.drop(x + self.wpe(position_ids) if self.wpe is not None else x)
        if self.fixnorm:  # FixNorm: unit-L2 rows times sqrt(d)
            x = F.embedding(input_ids, F.normalize(self.wte.weight, dim=-1)) * math.sqrt(self.config.hidden_size)
        else:
            x = self.wte(input_ids)
        if self.is_ngpt:
            return x
        if self.wpe is not None:
            x = x + self.wpe(position_ids)
        if self.emb_scale is not None:
            x = self.emb_scale(x)
        if self.emb_norm is not None:
            x = self.emb_norm(x)
        return self.drop(x)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        if self.is_ngpt:
            return self.sz() * self.lm_head(x)
        if self.ln_f is not None:
            x = self.ln_f(x)
        if self.fixnorm and self.config.tie_word_embeddings:  # tied: the head uses the unit-norm rows
            logits = F.linear(x, F.normalize(self.lm_head.weight, dim=-1))
        else:
            logits = self.lm_head(x)
        scale = float(getattr(self.config, "logit_scale", 1.0))  # muP's 1/m readout multiplier
        return logits * scale if scale != 1.0 else logits

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache=None,
        past_key_values=None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ):
        if input_ids is None:
            raise ValueError("NormbenchForCausalLM needs input_ids (inputs_embeds are not supported)")
        cache = cache if cache is not None else past_key_values
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if use_cache and cache is None and not self.training:
            cache = DynamicCache(config=self.config) if _V5 else DynamicCache()
        B, T = input_ids.shape
        past = cache.get_seq_length() if cache is not None else 0
        if position_ids is None:
            position_ids = torch.arange(past, past + T, device=input_ids.device)[None].expand(B, T)
        ctx = {"cache": cache, "mask": causal_mask(attention_mask, past, T, input_ids.device), "rope": None}
        if self.is_ngpt or self.config.position == "rope":
            ctx["rope"] = rope(position_ids, self.head_dim, self.config.rope_theta, self.wte.weight.dtype)
        x = self.embed(input_ids, position_ids)
        for i, block in enumerate(self.blocks):
            ctx["layer"] = i
            x = block(x, ctx)
        logits = self.logits(x)
        loss = None
        if labels is not None:  # transformers convention: labels are the inputs, shifted here
            loss = F.cross_entropy(
                upcast(logits[:, :-1]).reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1), ignore_index=-100
            )
        out = CausalLMOutputWithPast(loss=loss, logits=logits, **{_CACHE_FIELD: cache})
        return out if return_dict is not False else out.to_tuple()
