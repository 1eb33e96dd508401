"""Model construction: ``build_model(cfg, vocab_size)`` picks the GPT or nGPT module."""

from __future__ import annotations

import math

import torch.nn as nn

import normbench.model.norm_sites  # registers lns, reordered, sandwich, sandwich_depth, normformer
import normbench.model.normfree  # registers rezero, fixup, tfixup before simplenorm: arch= lists
import normbench.norm.scale_and_batch_norms  # noqa: F401 (registers scalenorm, seednorm, batchnorm, powernorm)
from normbench.config.arch_traits import arch_traits
from normbench.errors import ConfigError
from normbench.model.combinations import check_combination
from normbench.model.gpt import GPT
from normbench.model.ngpt import NGPT
from normbench.model.normfree import NormFreeGPT
from normbench.model.simplegpt import SimpleGPT
from normbench.norm.norm_api import Norm, norm_class, register_norm

__all__ = [
    "GPT",
    "NANOGPT_SHAPE",
    "NGPT",
    "Norm",
    "build_model",
    "check_combination",
    "norm_class",
    "padded_vocab",
    "register_norm",
    "weight_init_std",
]

# ArchTraits.model -> the module class that builds the arch
MODEL_CLASSES: dict[str, type[nn.Module]] = {"gpt": GPT, "ngpt": NGPT, "simplegpt": SimpleGPT, "normfree": NormFreeGPT}

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


def padded_vocab(cfg, data_vocab: int) -> int:
    vocab = cfg.model.vocab_size or data_vocab
    if vocab < data_vocab:
        raise ConfigError(f"model.vocab_size={vocab} is smaller than the tokenizer's vocabulary ({data_vocab})")
    step = cfg.model.pad_vocab_to
    return step * math.ceil(vocab / step)


def weight_init_std(cfg) -> float:
    """The std a run's plain weight matrices and embedding start from, as the model builds them (the model
    class's own ``init_std``: nGPT's and the norm-free archs' d^-0.5, SimpleGPT's 0.02, TinyInit,
    HybridNorm's small init, else ``model.init_std`` at this width). ``reproduce`` records it per group
    and refuses a comparison whose groups differ in it unless the claim says so."""
    return model_class(cfg).init_std(cfg.model, cfg.arch)


def model_class(cfg) -> type[nn.Module]:
    """The module class an arch builds: its own geometry (nGPT, SimpleGPT, the norm-free nets) or the GPT."""
    return MODEL_CLASSES[arch_traits(cfg.arch.name).model]


def build_model(cfg, vocab_size: int) -> nn.Module:
    cls = model_class(cfg)
    if cls is NGPT:
        model = NGPT(cfg.model, cfg.arch, vocab_size)
    else:
        model = cls(cfg.model, cfg.arch, cfg.norm, vocab_size)
    set_attention_fp32(model, bool(getattr(cfg, "attn_fp32", False)))
    return model


def set_attention_fp32(model: nn.Module, on: bool) -> None:
    """``attn_fp32``: every attention module runs its SDPA kernel in fp32 under a half-precision autocast
    (attention.sdpa); an execution setting like ``precision``, so it changes no weight and no export."""
    for module in model.modules():
        if hasattr(module, "sdpa_fp32"):
            module.sdpa_fp32 = on
