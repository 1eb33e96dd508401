"""The self-contained transformers model for any normbench arch x norm (``trust_remote_code``).

The export ships ``hf_template/*_normbench.py`` (configuration, modeling, layers, norms) into the output
directory. Its config is read off the trained module tree (norm classes, eps, which norms
each sublayer has, residual and input scales, gates, head scales, nGPT's multipliers), never
from normbench's config defaults, so a model built under other defaults exports as it computes.
Its parameter names are normbench's, so the weights are the checkpoint's state dict as it is,
less PowerNorm's training-only buffers. A norm module class the template does not compute (a
plugin's ``register_norm``) is refused in one line naming its ``norm=``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch.nn as nn

from normbench.errors import ConfigError
from normbench.model.gpt import GPT
from normbench.model.ngpt import NGPT
from normbench.model.normfree import NormFreeGPT
from normbench.model.simplegpt import SimpleGPT
from normbench.norm.norms import Derf, DyT, EmbedScale, LayerNorm, RMSNorm
from normbench.norm.scale_and_batch_norms import BatchNormBT, CRMSNorm, PowerNorm, ScaleNorm, SeeDNorm

TEMPLATE = Path(__file__).resolve().parent.parent / "hf_template"  # normbench/hf_template/: its own package
FILES = tuple(sorted(p.name for p in TEMPLATE.glob("*_normbench.py")))  # modeling_ imports the others
AUTO_MAP = {
    "AutoConfig": "configuration_normbench.NormbenchConfig",
    "AutoModelForCausalLM": "modeling_normbench.NormbenchForCausalLM",
}


def _pointwise_spec(mod: nn.Module, has) -> dict:
    derf = isinstance(mod, Derf)
    kind = "derf" if derf else "dyt"
    if has("shift") != derf:
        raise ConfigError(f"export: a {kind} norm {'without' if derf else 'with'} a shift is not supported")
    return {"kind": kind, "affine": has("weight"), "bias": has("bias")}


# norm module class -> its spec for the template (norms_normbench.build_norm); the first match wins
_SPECS = (
    (LayerNorm, lambda m, has: {"kind": "layernorm", "eps": m.eps, "affine": has("weight"), "bias": has("bias")}),
    (RMSNorm, lambda m, has: {"kind": "rmsnorm", "eps": m.eps, "affine": has("weight"), "bias": False}),
    ((DyT, Derf), _pointwise_spec),
    (ScaleNorm, lambda m, has: {"kind": "scalenorm", "eps": m.eps, "affine": has("weight")}),
    (CRMSNorm, lambda m, has: {"kind": "crmsnorm", "eps": m.eps, "affine": has("weight")}),
    (SeeDNorm, lambda m, has: {"kind": "seednorm", "eps": m.eps, "heads": int(m.heads)}),
    (BatchNormBT, lambda m, has: {"kind": "batchnorm", "eps": m.eps, "affine": has("weight"), "bias": has("bias")}),
    (
        PowerNorm,
        lambda m, has: {
            "kind": "powernorm",
            "eps": m.eps,
            "groups": int(m.groups),
            "affine": has("weight"),
            "bias": has("bias"),
        },
    ),
    (nn.Identity, lambda m, has: {"kind": "none"}),
)
# what the template's build_norm computes; a norm class outside this list is refused naming its ``norm=``
EXPORTED_NORMS = ("layernorm", "rmsnorm", "dyt", "derf", "scalenorm", "crmsnorm", "seednorm", "batchnorm", "powernorm")
# training-only state that the evaluation form does not read: not shipped
TRAINING_BUFFERS = {PowerNorm: ("ema_gz", "iters")}


def norm_spec(mod: nn.Module, norm_name: str | None = None) -> dict:
    """What a norm module computes, read from the module itself (its class, eps, which parameters it has).

    ``norm_name``: the run's ``norm=``, named in the refusal of a module the template does not compute."""
    has = lambda name: getattr(mod, name, None) is not None
    for cls, spec in _SPECS:
        if type(mod) is cls or (isinstance(cls, tuple) and type(mod) in cls):
            out = spec(mod, has)
            if getattr(mod, "unit_offset", 0.0):  # a gain stored as 1 + w (arch.gain_offset)
                out["unit_offset"] = float(mod.unit_offset)
            return out
    name = norm_name or type(mod).__name__
    raise ConfigError(
        f"export: norm={name} ({type(mod).__name__}) is not supported: the exported class computes "
        f"{'/'.join(EXPORTED_NORMS)}/none"
    )


def _norms(model: GPT) -> list[nn.Module]:
    """Every norm module of a GPT but the final one."""
    found = [model.emb_norm]
    for b in model.blocks:
        for sub in (b.attn, b.mlp):
            found += [sub.norm_in, sub.norm_out, sub.norm_post]
        attn, mlp = b.attn.core, b.mlp.core  # SimpleGPT's norms sit inside its sublayers
        found += [getattr(attn, n, None) for n in ("q_norm", "k_norm", "v_norm", "o_norm")]
        found += [getattr(mlp, n, None) for n in ("mid_norm", "fc_norm", "gate_norm", "down_norm")]
    return [m for m in found if m is not None]


def _common_norm(model: GPT, norm_name: str) -> tuple[dict, dict | None]:
    """(the one norm spec the blocks share, the final norm's where it differs) (one `norm=` builds them all;
    SeeDNorm keeps RMSNorm as its final norm unless norm.seed_final=true)."""
    specs = [norm_spec(m, norm_name) for m in _norms(model)]
    final = norm_spec(model.ln_f, norm_name) if model.ln_f is not None else None
    if not specs:
        specs = [final] if final is not None else [{"kind": "none"}]
    first = specs[0]  # the eps of a head norm equals the others'; everything but the dim is compared
    if any(s != first for s in specs[1:]):
        raise ConfigError(f"export: the model mixes norm layers ({first} vs others); one norm kind per model")
    return first, (final if final not in (None, first) else None)


def _sublayer(sub) -> dict:
    branch = float(getattr(sub, "branch_scale", 1.0))  # CompleteP's L_base / L (model/mup.py): only where set
    return ({"branch_scale": branch} if branch != 1.0 else {}) | {
        "in_norm": sub.norm_in is not None,
        "out_norm": sub.norm_out is not None,
        "post_norm": sub.norm_post is not None,
        "residual_after_norm": bool(sub.spec.residual_after_norm),
        "alpha": float(sub.alpha),
        "in_scale": float(getattr(sub, "in_scale", 1.0)),  # LNS: 1/sqrt(l)
        "resid_scale": getattr(sub, "resid_scale", None) is not None,  # NormFormer's lambda
        "mid_norm": getattr(sub.core, "mid_norm", None) is not None,  # NormFormer's FFN norm
    }


def block_spec(b) -> dict:
    core = b.attn.core
    return {
        "attn": _sublayer(b.attn),
        "mlp": _sublayer(b.mlp),
        "qk_norm": core.q_norm is not None,
        "qk_width": bool(getattr(core, "qk_width", False)),
        "v_norm": core.v_norm is not None,
        "gate_width": core.gate.out_features if getattr(core, "gate", None) is not None else 0,
        "head_scale": getattr(core, "head_scale", None) is not None,
    }


def _embed_scale(model: GPT) -> bool:
    if model.emb_scale is None:
        return False
    if not isinstance(model.emb_scale, EmbedScale) or [n for n, _ in model.emb_scale.named_parameters()] != ["scale"]:
        raise ConfigError("export: the embedding scale is not one learnable scalar `scale`; update the exporter")
    return True


def config_dict(model: nn.Module, cfg, vocab_size: int) -> dict:
    """The NormbenchConfig fields that make the template compute ``model``."""
    if type(model) not in (GPT, SimpleGPT, NormFreeGPT, NGPT):
        raise ConfigError(
            f"export: arch={cfg.arch.name} is not supported (its model class {type(model).__name__} is not one the "
            "exported class computes: GPT, SimpleGPT, NormFreeGPT, NGPT)"
        )
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
        return {**base, **_ngpt_fields(model)}
    return {**base, **_gpt_fields(model, cfg)}


def _ngpt_fields(model: NGPT) -> dict:
    b0 = model.blocks[0]
    mult = lambda v: v.init / v.scale  # ScaledVector: param * (init / scale)
    names = ("attn_alpha", "mlp_alpha", "sqk", "suv")
    return {
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


def _gpt_fields(model: GPT, cfg) -> dict:
    """The fields of a GPT, a SimpleGPT (its norms inside the sublayers) or a norm-free GPT."""
    b0 = model.blocks[0]
    free = isinstance(model, NormFreeGPT)
    if free:  # no norm anywhere; fixup's ln_f is its output shift
        norm, final, blocks = {"kind": "none"}, None, [{} for _ in model.blocks]
    else:
        norm, final = _common_norm(model, cfg.norm.name)
        blocks = [block_spec(b) | ({"simple": True} if isinstance(model, SimpleGPT) else {}) for b in model.blocks]
    return {
        "intermediate_size": b0.mlp.core.c_proj.in_features,
        "position": "rope" if model.use_rope else "learned",
        "mlp": b0.mlp.core.kind,
        "bias": b0.attn.core.c_attn.bias is not None,
        "dropout": float(getattr(model.drop, "p", 0.0)),
        "norm": norm,
        "blocks": blocks,
        "final_norm": model.ln_f is not None and not free,
        "final_norm_spec": final,
        "embed_norm": model.emb_norm is not None,
        "embed_scale": _embed_scale(model),
        "fixnorm": bool(getattr(model, "fixnorm", False)),
        "norm_free": {"kind": model.kind, "embed_mult": float(model.embed_mult)} if free else None,
        "tie_word_embeddings": model.lm_head.weight is model.wte.weight,
    } | _readout(model)


def _readout(model: GPT) -> dict:
    """muP's 1/m on the logits (model/mup.py), only where it is not 1: other exports' configs stay as they were."""
    mult = float(getattr(model, "readout_mult", 1.0))
    return {"logit_scale": mult} if mult != 1.0 else {}


def shipped_state(model: nn.Module) -> dict:
    """``model``'s state dict less the training-only buffers the template does not have."""
    drop = {
        f"{name}.{buf}" if name else buf
        for name, mod in model.named_modules()
        for buf in TRAINING_BUFFERS.get(type(mod), ())
    }
    return {k: v for k, v in model.state_dict().items() if k not in drop}


def write_code(out_dir: Path) -> None:
    for name in FILES:
        shutil.copyfile(TEMPLATE / name, Path(out_dir) / name)


def template_classes():
    """The template's (config class, model class), imported from normbench's copy (same code as shipped)."""
    from normbench.hf_template.configuration_normbench import NormbenchConfig  # deferred (start-up time): transformers
    from normbench.hf_template.modeling_normbench import NormbenchForCausalLM  # deferred (start-up time): transformers

    return NormbenchConfig, NormbenchForCausalLM
