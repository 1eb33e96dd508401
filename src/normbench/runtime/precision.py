"""A run's numerics: ``precision`` (the autocast dtype; master weights stay fp32) and ``attn_fp32`` (the attention
kernel left in fp32 under that autocast, model/attention.sdpa), read in one place by the trainer, the paired
benchmark and the report."""

from __future__ import annotations

import functools
import platform

import torch

from normbench.runtime.cpu import cpu_flags

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


@functools.lru_cache(maxsize=1)
def cpu_native_bf16() -> bool:
    """Whether this CPU multiplies bf16 in hardware: avx512_bf16 or AMX on x86, the bf16 extension on Arm.

    Without it torch's CPU bf16 products are emulated: on an AVX2-only AMD EPYC (torch 2.13) a bf16 matmul ran
    at 2% to 6% of the fp32 rate, and on an avx512f Xeon without avx512_bf16 the claims' bf16 mode ran at 0.63x
    eager fp32 (docs/performance.md §7). torch.cpu's probes are private but stable since 2.1; a torch that lacks
    them counts as no native bf16, the safe side (fp32 is never slow)."""
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    if any(getattr(torch.cpu, name, lambda: False)() for name in probes):
        return True
    if platform.machine().lower() in ("aarch64", "arm64"):
        return "bf16" in cpu_flags()
    return False
