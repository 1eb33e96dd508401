"""Model construction: ``build_model(cfg, vocab_size)`` picks the GPT or nGPT module."""

from __future__ import annotations

import math

import torch.nn as nn

import normbench.model.norm_sites  # noqa: F401 (registers lns, reordered, sandwich, sandwich_depth, normformer)
import normbench.model.scale_and_batch_norms  # noqa: F401 (registers scalenorm, seednorm, batchnorm, powernorm)
from normbench.config.schema import qk_norm_mode
from normbench.errors import ConfigError
from normbench.model.gpt import GPT
from normbench.model.ngpt import NGPT
from normbench.model.normfree import NORM_FREE, NormFreeGPT
from normbench.model.norms import site_alphas
from normbench.model.simplegpt import SIMPLENORM_NORMS, SimpleGPT

__all__ = ["GPT", "NANOGPT_SHAPE", "NGPT", "build_model", "check_combination", "padded_vocab", "weight_init_std"]

# The overrides under which GPT computes exactly karpathy/nanoGPT's model (tests/test_model.py
# checks the logits; scripts/bench_throughput.py races it against a plain loop).
NANOGPT_SHAPE = (
    "arch=pre_ln",
    "norm=layernorm",
    "model.pos=learned",
    "model.mlp=gelu",
    "model.bias=true",
    "model.tie_embeddings=true",
)

# Architectures whose blocks keep a norm even when norm=none would remove it are refused.
_NEEDS_NORM = (
    "post_ln", "peri_ln", "mix_ln", "hybridnorm", "hybridnorm_star", "deepnorm",
    "lns", "reordered", "sandwich", "sandwich_depth", "normformer",
)  # fmt: skip
# Norms with a per-channel gain vector: what arch.gain_offset (1 + w) and sandwich_depth's gain init act on.
_GAIN_NORMS = ("layernorm", "rmsnorm", "dyt", "derf")


def padded_vocab(cfg, data_vocab: int) -> int:
    vocab = cfg.model.vocab_size or data_vocab
    if vocab < data_vocab:
        raise ConfigError(f"model.vocab_size={vocab} is smaller than the tokenizer's vocabulary ({data_vocab})")
    step = cfg.model.pad_vocab_to
    return step * math.ceil(vocab / step)


def check_combination(cfg) -> list[str]:
    """Refuse arch x norm combinations that make no sense (ConfigError, one line); return start-up notes.

    Refused: ``norm=none`` with any arch but ``pre_ln`` (the other archs would lose the
    norms that define them); ``arch.qk_norm=head|width`` with ``norm=none``; ``norm.embed_scale``
    with a norm other than dyt/derf (the sqrt(d) embedding scalar is part of their LLM recipe);
    ``mix_ln`` without its final norm (the paper always applies it); ``arch.attn_gate`` with nGPT;
    ``arch.gain_offset`` and ``arch=sandwich_depth`` without a gain vector; ``arch.tiny_init`` with another
    init rule (:func:`_check_norm_sites`).
    Noted, never silent: keys an arch ignores (nGPT ignores ``norm=``, warmup and the model
    keys it has no use for; ``arch.alpha``/``beta`` belong to DeepNorm, ``arch.post_ratio`` to
    Mix-LN), ablations that leave a paper's recipe (Peri-LN without Output-norm gains), and the
    a0 and init a DyT/Derf run resolved.
    """
    arch, norm, a = cfg.arch.name, cfg.norm.name, cfg.arch
    notes = []
    if arch != "deepnorm" and (a.alpha is not None or a.beta is not None):
        notes.append(f"arch={arch} ignores arch.alpha/arch.beta (DeepNorm's residual scale and init gain)")
    if arch != "mix_ln" and a.post_ratio != 0.25:
        notes.append(f"arch={arch} ignores arch.post_ratio={a.post_ratio} (Mix-LN's share of Post-LN blocks)")
    if arch in NORM_FREE or arch == "simplenorm":
        notes += check_norm_free_and_simplenorm(cfg)
        if arch in NORM_FREE:  # no norm: the norm.* checks below have nothing to check
            return notes
    if arch == "ngpt":
        if a.attn_gate != "none":
            raise ConfigError(
                f"arch.attn_gate={a.attn_gate} with arch=ngpt: nGPT keeps every matrix on the unit sphere, so the "
                "gate logit x W_g would be a cosine and sigmoid could never close it (nGPT defines no scale for it); "
                "allowed with ngpt: none"
            )
        if norm != "none":
            notes.append(f"arch=ngpt ignores norm={norm}: nGPT normalizes by L2 projection onto the unit sphere")
        if cfg.model.tie_embeddings:
            notes.append("arch=ngpt unties embeddings (the reference never ties wte and lm_head)")
        if cfg.sched.warmup_steps != 0:
            warm = "null (10% of the run)" if cfg.sched.warmup_steps is None else cfg.sched.warmup_steps
            notes.append(f"arch=ngpt trains without warmup, as its reference: sched.warmup_steps={warm} ignored")
        m = cfg.model
        ignored = [
            f"{key}={value}"
            for key, value, default in (
                ("model.pos", m.pos, "rope"),
                ("model.mlp", m.mlp, "swiglu"),
                ("model.bias", m.bias, False),
                ("model.dropout", m.dropout, 0.0),
                ("model.fixnorm", m.fixnorm, False),
                ("arch.qk_norm", a.qk_norm if qk_norm_mode(a.qk_norm) != "none" else False, False),
                ("arch.final_norm", a.final_norm, False),
                ("arch.embed_norm", a.embed_norm, False),
                ("arch.gain_offset", a.gain_offset, False),
                ("arch.tiny_init", a.tiny_init, False),
                ("arch.scale_resids", a.scale_resids, False),
            )
            if value != default
        ]
        if ignored:
            notes.append(
                f"arch=ngpt ignores {', '.join(ignored)}: it always uses RoPE, SwiGLU, no biases, no dropout, "
                "and L2 normalization in place of q/k, final and embedding norms"
            )
        return notes
    if arch == "mix_ln" and not a.final_norm:
        raise ConfigError("arch.final_norm=false: mix_ln always applies the final norm (Li et al. 2024); allowed: true")
    qk = qk_norm_mode(a.qk_norm)
    if arch in ("hybridnorm", "hybridnorm_star") and qk != "none":
        notes.append(f"arch={arch} normalizes q, k and v by construction; arch.qk_norm={qk} adds nothing")
    if arch == "peri_ln" and not cfg.norm.affine:
        notes.append("norm.affine=false removes Peri-LN's Output-norm gains, which its paper keeps learnable")
    if norm == "none" and arch in _NEEDS_NORM:
        raise ConfigError(
            f"norm=none with arch={arch} removes every norm the arch places, which is arch=pre_ln norm=none; "
            "allowed with norm=none: pre_ln"
        )
    if norm == "none" and qk != "none":
        raise ConfigError(
            f"arch.qk_norm={qk} needs a norm layer; norm=none has none (choose layernorm/rmsnorm/dyt/derf)"
        )
    notes += _check_norm_sites(cfg)
    if cfg.norm.embed_scale and norm not in ("dyt", "derf"):
        raise ConfigError(
            f"norm.embed_scale=true belongs to the DyT/Derf recipe; norm={norm} has no embedding scalar "
            "(set norm.embed_scale=false or choose norm=dyt/derf)"
        )
    if norm in ("dyt", "derf"):
        d = cfg.model.d_model
        a = site_alphas(cfg.norm, d)
        notes.append(f"norm={norm}: alpha0 attn/ffn/final {a['attn']:g}/{a['ffn']:g}/{a['final']:g} (d_model={d})")
        if cfg.model.init_std == "auto" and not (cfg.arch.small_init or cfg.arch.tiny_init):  # auto is drawn
            notes.append(
                f"norm={norm} at model.init_std=auto starts at GPT-2's gain (0.55); its LLaMA-style references start "
                "near 1.3, and at small widths it learns far better at model.init_std=fan_in (gain 1; docs/init.md)"
            )
    return notes


def weight_init_std(cfg) -> float:
    """The std a run's plain weight matrices and embedding start from, as the model builds them (the model
    class's own ``init_std``: nGPT's and the norm-free archs' d^-0.5, SimpleGPT's 0.02, TinyInit,
    HybridNorm's small init, else ``model.init_std`` at this width). ``reproduce`` records it per group
    and refuses a comparison whose groups differ in it unless the claim says so."""
    return model_class(cfg).init_std(cfg.model, cfg.arch)


def check_norm_free_and_simplenorm(cfg) -> list[str]:
    """Combinations of ``arch=simplenorm`` and the norm-free archs (rezero, fixup, tfixup): ConfigError
    (one line) for what they cannot build, start-up notes for what they ignore (docs/contract.md)."""
    arch, norm, a, m = cfg.arch.name, cfg.norm.name, cfg.arch, cfg.model
    notes = []
    if arch == "simplenorm":
        if norm not in SIMPLENORM_NORMS:
            raise ConfigError(
                f"norm={norm} with arch=simplenorm: SimpleNorm puts a statistic norm after every linear map "
                f"(Ocram7/SimpleGPT offers RMSNorm and LayerNorm); allowed: {', '.join(SIMPLENORM_NORMS)}"
            )
        if m.fixnorm:
            raise ConfigError(
                "model.fixnorm=true with arch=simplenorm: SimpleGPT's embedding is N(0, 1); allowed: false"
            )
        if m.tie_embeddings:
            notes.append("arch=simplenorm unties embeddings (SimpleGPT's head is its own matrix, trunc-normal d^-0.5)")
        if qk_norm_mode(a.qk_norm) != "none":
            notes.append(
                f"arch=simplenorm normalizes q, k and v (whole width) by construction; arch.qk_norm={a.qk_norm} "
                "adds nothing"
            )
    elif arch in NORM_FREE:
        if qk_norm_mode(a.qk_norm) != "none":
            raise ConfigError(
                f"arch.qk_norm={a.qk_norm} with arch={arch}: a norm-free net has no norm layer; allowed: none"
            )
        for key in ("final_norm", "embed_norm"):
            if getattr(a, key):
                raise ConfigError(
                    f"arch.{key}=true with arch={arch}: a norm-free net has no norm layer; allowed: false"
                )
        if arch != "rezero" and m.fixnorm:
            raise ConfigError(f"model.fixnorm=true with arch={arch}: it sets its own embedding scale; allowed: false")
        if norm != "none":
            notes.append(f"arch={arch} ignores norm={norm}: it has no norm layer (use norm=none in sweeps)")
        keys = (("arch.small_init", a.small_init, False), ("arch.embed_init_std", a.embed_init_std, None))
        own_init = [f"{k}={v}" for k, v, default in (*keys, ("model.init_std", m.init_std, "auto")) if v != default]
        own_init = [k for k in own_init if k != "model.init_std=fan_in"]  # d^-0.5 is their own base std
        if own_init:
            notes.append(f"arch={arch} ignores {', '.join(own_init)}: its paper's init sets every weight")
    if getattr(a, "attn_gate", "none") != "none":  # their blocks build their own attention, without the gate
        raise ConfigError(
            f"arch.attn_gate={a.attn_gate} with arch={arch}: the gate is not built into its own blocks yet; "
            "allowed: none"
        )
    if arch == "simplenorm" and a.small_init:
        notes.append("arch=simplenorm ignores arch.small_init=true: SimpleGPT's init sets every weight")
    return notes


def _check_norm_sites(cfg) -> list[str]:
    """The keys of model/norm_sites.py: refused where they cannot act, noted where ignored."""
    arch, norm, a, notes = cfg.arch.name, cfg.norm.name, cfg.arch, []
    for key, value, owner in (("scale_resids", a.scale_resids, "normformer"), ("dssn_c_attn", a.dssn_c_attn,
                              "sandwich_depth"), ("dssn_c_mlp", a.dssn_c_mlp, "sandwich_depth")):  # fmt: skip
        if value not in (None, False) and arch != owner:
            notes.append(f"arch={arch} ignores arch.{key}={value} ({owner} only)")
    gains = "(layernorm/rmsnorm/dyt/derf with norm.affine=true)"
    if a.gain_offset and (norm not in _GAIN_NORMS or not cfg.norm.affine):
        raise ConfigError(
            f"arch.gain_offset=true stores each norm gain as 1 + w; norm={norm}"
            f"{' with norm.affine=false' if norm in _GAIN_NORMS else ''} has no gain vector {gains}"
        )
    if arch == "sandwich_depth" and (norm not in _GAIN_NORMS or not cfg.norm.affine):
        raise ConfigError(
            f"arch=sandwich_depth initialises the output-norm gains to c/sqrt(L); norm={norm}"
            f"{' with norm.affine=false' if norm in _GAIN_NORMS else ''} has no gain vector {gains}"
        )
    if a.tiny_init and a.small_init:
        raise ConfigError("arch.tiny_init=true and arch.small_init=true both set the init std; choose one")
    if arch == "lns" and a.scaled_init:
        notes.append("arch=lns with arch.scaled_init=true: the LNS authors advise against depth-scaled init")
    return notes


def model_class(cfg) -> type[nn.Module]:
    """The module class an arch builds: its own geometry (nGPT, SimpleGPT, the norm-free nets) or the GPT."""
    if cfg.arch.name == "ngpt":
        return NGPT
    if cfg.arch.name == "simplenorm":
        return SimpleGPT
    return NormFreeGPT if cfg.arch.name in NORM_FREE else GPT


def build_model(cfg, vocab_size: int) -> nn.Module:
    cls = model_class(cfg)
    if cls is NGPT:
        return NGPT(cfg.model, cfg.arch, vocab_size)
    return cls(cfg.model, cfg.arch, cfg.norm, vocab_size)
