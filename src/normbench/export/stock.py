"""Stock transformers classes for the normbench models that are exactly one of them.

- ``GPT2LMHeadModel`` (Radford et al. 2019; nanoGPT's shape): Pre-LN with LayerNorm (gain and
  bias), learned positions, exact-erf GELU MLP (``activation_function="gelu"``, not GPT-2's
  tanh ``gelu_new``), biases on every Linear, a final norm. Conv1D stores weights transposed.
- ``LlamaForCausalLM`` (Touvron et al. 2023): Pre-LN with RMSNorm (gain), rotate-half RoPE,
  SwiGLU, a final norm; ``model.bias`` maps to both ``attention_bias`` and ``mlp_bias``.
- ``Qwen3ForCausalLM`` (Qwen3 technical report, 2025): the Llama shape plus per-head q/k RMSNorm
  before RoPE (``arch.qk_norm=true``), no biases.
Anything else (another placement, DyT/Derf, an embedding scalar or norm, a norm without gain,
dropout on a Llama-shaped model, ...) goes to the custom class (custom.py). Everything is read
off the trained modules: which norms exist, their eps, tying, biases, widths.
"""

from __future__ import annotations

import dataclasses

import torch

from normbench.export.custom import block_spec, norm_spec
from normbench.model.gpt import GPT

_PLAIN_SUB = {"in_norm": True, "out_norm": False, "post_norm": False, "residual_after_norm": False, "alpha": 1.0}
_PLAIN_SUB.update({"in_scale": 1.0, "resid_scale": False, "mid_norm": False})
_PLAIN_ATTN = {"qk_width": False, "v_norm": False, "gate_width": 0, "head_scale": False}


def _is_plain_pre_ln(model: GPT) -> bool:
    """Pre-LN blocks with nothing but an input norm per sublayer (per-head q/k norms allowed), a final norm."""
    for b in model.blocks:
        spec = block_spec(b)
        if spec["attn"] != _PLAIN_SUB or spec["mlp"] != _PLAIN_SUB:
            return False
        if any(spec[k] != v for k, v in _PLAIN_ATTN.items()):
            return False
    plain_embed = model.emb_norm is None and model.emb_scale is None and not getattr(model, "fixnorm", False)
    plain_head = getattr(model, "readout_mult", 1.0) == 1.0  # muP's logit multiplier: the custom class has it
    return model.ln_f is not None and plain_embed and plain_head


def _norm_specs(model: GPT, with_qk: bool) -> list[dict]:
    mods = [model.ln_f] + [m for b in model.blocks for m in (b.attn.norm_in, b.mlp.norm_in)]
    if with_qk:
        mods += [m for b in model.blocks for m in (b.attn.core.q_norm, b.attn.core.k_norm)]
    return [norm_spec(m) for m in mods]


def stock_kind(model, cfg) -> str | None:
    """``gpt2``, ``llama``, ``qwen3``, or None when no stock class computes exactly this model."""
    if type(model) is not GPT or not _is_plain_pre_ln(model):  # SimpleGPT, the norm-free GPTs: their own blocks
        return None
    b0 = model.blocks[0]
    qk = b0.attn.core.q_norm is not None
    if any((b.attn.core.q_norm is not None) != qk for b in model.blocks):
        return None
    biased = [lin.bias is not None for b in model.blocks for lin in _linears(b)]
    bias = all(biased)
    if any(biased) and not bias:
        return None
    specs = _norm_specs(model, qk)
    eps = {s.get("eps") for s in specs}
    if len(eps) != 1:
        return None
    kind = b0.mlp.core.kind
    if all(s == {"kind": "layernorm", "eps": specs[0].get("eps"), "affine": True, "bias": True} for s in specs):
        if not model.use_rope and kind == "gelu" and bias and not qk:
            return "gpt2"
        return None
    if not all(s == {"kind": "rmsnorm", "eps": specs[0].get("eps"), "affine": True, "bias": False} for s in specs):
        return None
    if not model.use_rope or kind != "swiglu" or cfg.model.dropout:
        return None  # Llama/Qwen3 have no residual or embedding dropout
    if not qk:
        return "llama"
    return "qwen3" if not bias else None  # Qwen3's MLP has no biases


def _linears(block) -> list[torch.nn.Linear]:
    return [block.attn.core.c_attn, block.attn.core.c_proj, block.mlp.core.c_fc, block.mlp.core.c_proj]


def _rope_kwargs(config_cls, theta: float) -> dict:
    names = {f.name for f in dataclasses.fields(config_cls)} if dataclasses.is_dataclass(config_cls) else set()
    if "rope_parameters" in names:  # transformers >= 5
        return {"rope_parameters": {"rope_type": "default", "rope_theta": float(theta)}}
    return {"rope_theta": float(theta)}


def build_stock(kind: str, model: GPT, cfg, vocab_size: int):
    """The transformers model of ``kind`` holding ``model``'s weights (fp32, eval mode)."""
    tied = model.lm_head.weight is model.wte.weight
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    hf_cls, config, out = (_gpt2 if kind == "gpt2" else _llama_or_qwen3)(kind, model, cfg, vocab_size, sd)
    out["lm_head.weight"] = sd["wte.weight"] if tied else sd["lm_head.weight"]
    hf = hf_cls(config).float().eval()
    missing, unexpected = hf.load_state_dict(out, strict=False)
    missing = [k for k in missing if not (tied and k == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"{hf_cls.__name__}: missing {missing[:4]}, unexpected {unexpected[:4]}")
    return hf


def _shape(model: GPT, cfg) -> dict:
    """What every stock config reads: width, depth, heads, MLP width, tying, the norms' eps."""
    return {
        "d": model.d_model,
        "L": model.n_layer,
        "H": cfg.model.n_head,
        "d_ff": model.blocks[0].mlp.core.c_proj.in_features,
        "tied": model.lm_head.weight is model.wte.weight,
        "eps": norm_spec(model.ln_f)["eps"],
    }


def _gpt2(kind: str, model: GPT, cfg, vocab_size: int, sd: dict):
    """GPT2LMHeadModel: (class, config, state dict but the head)."""
    from transformers import GPT2Config, GPT2LMHeadModel  # deferred (start-up time): transformers

    s, p = _shape(model, cfg), float(cfg.model.dropout)
    config = GPT2Config(
        vocab_size=vocab_size,
        n_positions=model.seq_len,
        n_embd=s["d"],
        n_layer=s["L"],
        n_head=s["H"],
        n_inner=s["d_ff"],
        activation_function="gelu",
        resid_pdrop=p,
        embd_pdrop=p,
        attn_pdrop=p,
        layer_norm_epsilon=s["eps"],
        tie_word_embeddings=s["tied"],
        bos_token_id=None,
        eos_token_id=None,
    )
    out = {"transformer.wte.weight": sd["wte.weight"], "transformer.wpe.weight": sd["wpe.weight"]}
    for i in range(s["L"]):
        src, dst = f"blocks.{i}.", f"transformer.h.{i}."
        for a, b in (("attn.norm_in", "ln_1"), ("mlp.norm_in", "ln_2")):
            out[f"{dst}{b}.weight"], out[f"{dst}{b}.bias"] = sd[f"{src}{a}.weight"], sd[f"{src}{a}.bias"]
        for a, b in (
            ("attn.core.c_attn", "attn.c_attn"),
            ("attn.core.c_proj", "attn.c_proj"),
            ("mlp.core.c_fc", "mlp.c_fc"),
            ("mlp.core.c_proj", "mlp.c_proj"),
        ):  # Conv1D: weight (in, out)
            out[f"{dst}{b}.weight"] = sd[f"{src}{a}.weight"].t().contiguous()
            out[f"{dst}{b}.bias"] = sd[f"{src}{a}.bias"]
    out["transformer.ln_f.weight"], out["transformer.ln_f.bias"] = sd["ln_f.weight"], sd["ln_f.bias"]
    return GPT2LMHeadModel, config, out


def _llama_or_qwen3(kind: str, model: GPT, cfg, vocab_size: int, sd: dict):
    """LlamaForCausalLM or Qwen3ForCausalLM: (class, config, state dict but the head)."""
    s, b0 = _shape(model, cfg), model.blocks[0]
    if kind == "llama":
        from transformers import LlamaConfig as config_cls  # deferred (start-up time): transformers
        from transformers import LlamaForCausalLM as hf_cls  # deferred (start-up time): transformers

        extra = {"attention_bias": b0.attn.core.c_attn.bias is not None, "mlp_bias": b0.mlp.core.c_fc.bias is not None}
    else:
        from transformers import Qwen3Config as config_cls  # deferred (start-up time): transformers
        from transformers import Qwen3ForCausalLM as hf_cls  # deferred (start-up time): transformers

        extra = {"attention_bias": False, "use_sliding_window": False, "max_window_layers": s["L"]}
    config = config_cls(
        vocab_size=vocab_size,
        hidden_size=s["d"],
        intermediate_size=s["d_ff"],
        num_hidden_layers=s["L"],
        num_attention_heads=s["H"],
        num_key_value_heads=s["H"],
        head_dim=s["d"] // s["H"],
        hidden_act="silu",
        max_position_embeddings=model.seq_len,
        rms_norm_eps=s["eps"],
        tie_word_embeddings=s["tied"],
        attention_dropout=0.0,
        bos_token_id=None,
        eos_token_id=None,
        **_rope_kwargs(config_cls, model.rope_theta),
        **extra,
    )
    out = {"model.embed_tokens.weight": sd["wte.weight"], "model.norm.weight": sd["ln_f.weight"]}
    for i in range(s["L"]):
        out.update(_llama_layer(sd, f"blocks.{i}.", f"model.layers.{i}.", kind == "qwen3"))
    return hf_cls, config, out


def _llama_layer(sd: dict, src: str, dst: str, qk_norm: bool) -> dict:
    """One block's weights under Llama's names: ``c_attn`` rows [q; k; v], ``c_fc`` rows [up; gate]."""
    out = {
        f"{dst}input_layernorm.weight": sd[f"{src}attn.norm_in.weight"],
        f"{dst}post_attention_layernorm.weight": sd[f"{src}mlp.norm_in.weight"],
    }
    for suffix in ("weight", "bias"):
        key = f"{src}attn.core.c_attn.{suffix}"
        if key in sd:
            for name, part in zip(("q_proj", "k_proj", "v_proj"), sd[key].chunk(3, dim=0)):
                out[f"{dst}self_attn.{name}.{suffix}"] = part.contiguous()
            out[f"{dst}self_attn.o_proj.{suffix}"] = sd[f"{src}attn.core.c_proj.{suffix}"]
        key = f"{src}mlp.core.c_fc.{suffix}"
        if key in sd:  # h = up * silu(gate)
            up, gate = sd[key].chunk(2, dim=0)
            out[f"{dst}mlp.up_proj.{suffix}"], out[f"{dst}mlp.gate_proj.{suffix}"] = up.contiguous(), gate.contiguous()
            out[f"{dst}mlp.down_proj.{suffix}"] = sd[f"{src}mlp.core.c_proj.{suffix}"]
    if qk_norm:
        out[f"{dst}self_attn.q_norm.weight"] = sd[f"{src}attn.core.q_norm.weight"]
        out[f"{dst}self_attn.k_norm.weight"] = sd[f"{src}attn.core.k_norm.weight"]
    return out
