"""Model construction: ``build_model(cfg, vocab_size)`` picks the GPT or nGPT module."""

from __future__ import annotations

import math

import torch.nn as nn

from normbench.errors import ConfigError
from normbench.model.gpt import GPT
from normbench.model.ngpt import NGPT

__all__ = ["GPT", "NANOGPT_SHAPE", "NGPT", "build_model", "check_combination", "padded_vocab"]

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
_NEEDS_NORM = ("post_ln", "peri_ln", "mix_ln", "hybridnorm", "hybridnorm_star", "deepnorm")


def padded_vocab(cfg, data_vocab: int) -> int:
    vocab = cfg.model.vocab_size or data_vocab
    if vocab < data_vocab:
        raise ConfigError(f"model.vocab_size={vocab} is smaller than the tokenizer's vocabulary ({data_vocab})")
    step = cfg.model.pad_vocab_to
    return step * math.ceil(vocab / step)


def check_combination(cfg) -> list[str]:
    """Refuse arch x norm combinations that make no sense (ConfigError, one line); return start-up notes.

    Refused: ``norm=none`` with any arch but ``pre_ln`` (the other archs would lose the
    norms that define them); ``arch.qk_norm=true`` with ``norm=none``; ``norm.embed_scale``
    with a norm other than dyt/derf (the sqrt(d) embedding scalar is part of their LLM recipe).
    nGPT ignores ``norm=`` and the model keys it has no use for, and says so in the notes.
    """
    arch, norm = cfg.arch.name, cfg.norm.name
    notes = []
    if arch == "ngpt":
        if norm != "none":
            notes.append(f"arch=ngpt ignores norm={norm}: nGPT normalizes by L2 projection onto the unit sphere")
        if cfg.model.tie_embeddings:
            notes.append("arch=ngpt unties embeddings (the reference never ties wte and lm_head)")
        m = cfg.model
        ignored = [
            f"model.{key}={value}"
            for key, value, default in (
                ("pos", m.pos, "rope"),
                ("mlp", m.mlp, "swiglu"),
                ("bias", m.bias, False),
                ("dropout", m.dropout, 0.0),
            )
            if value != default
        ]
        if ignored:
            notes.append(f"arch=ngpt ignores {', '.join(ignored)}: it always uses RoPE, SwiGLU, no biases, no dropout")
        return notes
    if norm == "none" and arch in _NEEDS_NORM:
        raise ConfigError(
            f"norm=none with arch={arch} removes every norm the arch places, which is arch=pre_ln norm=none; "
            "allowed with norm=none: pre_ln"
        )
    if norm == "none" and cfg.arch.qk_norm:
        raise ConfigError(
            "arch.qk_norm=true needs a norm layer; norm=none has none (choose layernorm/rmsnorm/dyt/derf)"
        )
    if cfg.norm.embed_scale and norm not in ("dyt", "derf"):
        raise ConfigError(
            f"norm.embed_scale=true belongs to the DyT/Derf recipe; norm={norm} has no embedding scalar "
            "(set norm.embed_scale=false or choose norm=dyt/derf)"
        )
    return notes


def build_model(cfg, vocab_size: int) -> nn.Module:
    if cfg.arch.name == "ngpt":
        return NGPT(cfg.model, cfg.arch, vocab_size)
    return GPT(cfg.model, cfg.arch, cfg.norm, vocab_size)
