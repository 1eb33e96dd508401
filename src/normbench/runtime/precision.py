"""A run's numerics: ``precision`` (the autocast dtype; master weights stay fp32) and ``attn_fp32`` (the attention
kernel left in fp32 under that autocast, model/attention.sdpa), read in one place by the trainer, the paired
benchmark and the report."""

from __future__ import annotations

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast_dtype(cfg) -> torch.dtype | None:
    """The autocast dtype of ``cfg.precision``; None for fp32 (no autocast)."""
    return DTYPES.get(cfg.precision)


def attn_fp32_active(cfg) -> bool:
    """Whether ``attn_fp32`` changes anything: it is set and there is an autocast to keep the kernel out of."""
    return bool(getattr(cfg, "attn_fp32", False)) and autocast_dtype(cfg) is not None


def precision_name(cfg) -> str:
    """``bf16``, ``bf16, attention fp32`` (attn_fp32 under autocast) or ``fp32``: the start-up line's words."""
    return f"{cfg.precision}{', attention fp32' if attn_fp32_active(cfg) else ''}"
