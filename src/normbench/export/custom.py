"""The self-contained transformers model for any normbench arch x norm (``trust_remote_code``).

The export ships ``hf_template/{configuration,modeling}_normbench.py`` into the output
directory. Its config is read off the trained module tree (norm classes, eps, which norms
each sublayer has, residual scales, nGPT's multipliers), never from normbench's config
defaults, so a model built under other defaults exports as it computes. Its parameter names
are normbench's, so the weights are the checkpoint's state dict as it is.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch.nn as nn

from normbench.errors import ConfigError
from normbench.model.gpt import GPT
from normbench.model.ngpt import NGPT
from normbench.model.norms import Derf, DyT, EmbedScale, LayerNorm, RMSNorm

TEMPLATE = Path(__file__).resolve().parent / "hf_template"
FILES = ("configuration_normbench.py", "modeling_normbench.py")
AUTO_MAP = {
    "AutoConfig": "configuration_normbench.NormbenchConfig",
    "AutoModelForCausalLM": "modeling_normbench.NormbenchForCausalLM",
}


def norm_spec(mod: nn.Module) -> dict:
    """What a norm module computes, read from the module itself."""
    has = lambda name: getattr(mod, name, None) is not None  # noqa: E731
    if isinstance(mod, LayerNorm):
        return {"kind": "layernorm", "eps": mod.eps, "affine": has("weight"), "bias": has("bias")}
    if isinstance(mod, RMSNorm):
        return {"kind": "rmsnorm", "eps": mod.eps, "affine": has("weight"), "bias": False}
    if isinstance(mod, (DyT, Derf)):
        kind = "derf" if isinstance(mod, Derf) else "dyt"
        if has("shift") != (kind == "derf"):
            raise ConfigError(
                f"export: a {kind} norm {'without' if kind == 'derf' else 'with'} a shift is not supported"
            )
        return {"kind": kind, "affine": has("weight"), "bias": has("bias")}
    if isinstance(mod, nn.Identity):
        return {"kind": "none"}
    raise ConfigError(f"export: norm module {type(mod).__name__} is not supported (layernorm/rmsnorm/dyt/derf/none)")


def _norms(model: GPT) -> list[nn.Module]:
    found = [model.emb_norm, model.ln_f]
    for b in model.blocks:
        for sub in (b.attn, b.mlp):
            found += [sub.norm_in, sub.norm_out, sub.norm_post]
        found += [b.attn.core.q_norm, b.attn.core.k_norm, b.attn.core.v_norm]
    return [m for m in found if m is not None]


def _common_norm(model: GPT, norm_name: str) -> dict:
    """The one norm spec all norms share (one `norm=` builds them all); ``norm=none`` has none left."""
    specs = [norm_spec(m) for m in _norms(model)]
    if not specs:
        return {"kind": "none"} if norm_name == "none" else {"kind": norm_name}
    # the eps of a head norm equals the others'; compare everything but the dim
    first = specs[0]
    if any(s != first for s in specs[1:]):
        raise ConfigError(f"export: the model mixes norm layers ({first} vs others); one norm kind per model")
    return first


def _sublayer(sub) -> dict:
    return {
        "in_norm": sub.norm_in is not None,
        "out_norm": sub.norm_out is not None,
        "post_norm": sub.norm_post is not None,
        "residual_after_norm": bool(sub.spec.residual_after_norm),
        "alpha": float(sub.alpha),
    }


def _embed_scale(model: GPT) -> bool:
    if model.emb_scale is None:
        return False
    if not isinstance(model.emb_scale, EmbedScale) or [n for n, _ in model.emb_scale.named_parameters()] != ["scale"]:
        raise ConfigError("export: the embedding scale is not one learnable scalar `scale`; update the exporter")
    return True


def config_dict(model: nn.Module, cfg, vocab_size: int) -> dict:
    """The NormbenchConfig fields that make the template compute ``model``."""
    b0 = model.blocks[0]
    base = {
        "vocab_size": vocab_size,
        "hidden_size": model.d_model,
        "num_hidden_layers": model.n_layer,
        "num_attention_heads": b0.n_head if isinstance(model, NGPT) else b0.attn.core.n_head,
        "max_position_embeddings": model.seq_len,
        "rope_theta": float(model.rope_theta),
        "arch": cfg.arch.name,
        "architectures": ["NormbenchForCausalLM"],
        "auto_map": dict(AUTO_MAP),
        "model_type": "normbench",
        "bos_token_id": None,
        "eos_token_id": None,
    }
    if isinstance(model, NGPT):
        mult = lambda v: v.init / v.scale  # noqa: E731 - ScaledVector: param * (init / scale)
        names = ("attn_alpha", "mlp_alpha", "sqk", "suv")
        return {
            **base,
            "intermediate_size": b0.mlp_c_proj.in_features,
            "position": "rope",
            "mlp": "swiglu",
            "bias": False,
            "norm": {"kind": "none"},
            "blocks": [],
            "final_norm": False,
            "ngpt": {
                "eps": b0.eps,
                "blocks": [{n: mult(getattr(b, n)) for n in names} for b in model.blocks],
                "sz": mult(model.sz),
            },
            "tie_word_embeddings": False,
        }
    if not isinstance(model, GPT):
        raise ConfigError(f"export: {type(model).__name__} is not a normbench GPT or nGPT model")
    return {
        **base,
        "intermediate_size": b0.mlp.core.c_proj.in_features,
        "position": "rope" if model.use_rope else "learned",
        "mlp": b0.mlp.core.kind,
        "bias": b0.attn.core.c_attn.bias is not None,
        "dropout": float(getattr(model.drop, "p", 0.0)),
        "norm": _common_norm(model, cfg.norm.name),
        "blocks": [
            {
                "attn": _sublayer(b.attn),
                "mlp": _sublayer(b.mlp),
                "qk_norm": b.attn.core.q_norm is not None,
                "v_norm": b.attn.core.v_norm is not None,
            }
            for b in model.blocks
        ],
        "final_norm": model.ln_f is not None,
        "embed_norm": model.emb_norm is not None,
        "embed_scale": _embed_scale(model),
        "tie_word_embeddings": model.lm_head.weight is model.wte.weight,
    }


def write_code(out_dir: Path) -> None:
    for name in FILES:
        shutil.copyfile(TEMPLATE / name, Path(out_dir) / name)


def template_classes():
    """The template's (config class, model class), imported from normbench's copy (same code as shipped)."""
    from normbench.export.hf_template.configuration_normbench import NormbenchConfig
    from normbench.export.hf_template.modeling_normbench import NormbenchForCausalLM

    return NormbenchConfig, NormbenchForCausalLM
