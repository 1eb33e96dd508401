"""A run's numerics: ``precision`` (the autocast dtype; master weights stay fp32) and ``attn_fp32`` (the attention
kernel left in fp32 under that autocast, model/attention.sdpa), read in one place by the trainer, the paired
benchmark and the report. ``precision=auto`` is resolved once, into the run spec (config/spec.py); everything
here reads the resolved value. On a GPU, whatever stays fp32 multiplies in TF32 (:func:`enable_tf32`, as
nanoGPT's ``train.py`` and torchtitan do): 10 mantissa bits in the products, fp32 accumulation.
"""

from __future__ import annotations

import contextlib
import functools
import platform

import torch

from normbench.config.spec import cuda_has_bf16, spec_of
from normbench.errors import ConfigError
from normbench.runtime.cpu import cpu_flags

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast_dtype(cfg) -> torch.dtype | None:
    """The autocast dtype of the run's precision (``precision=auto`` resolved); None for fp32 (no autocast)."""
    return DTYPES.get(spec_of(cfg).precision)


def autocast(cfg, device: torch.device):
    """The run's forward-precision context, made per use: ``torch.autocast`` in its dtype, or none for fp32 (the
    trainer's steps and evaluations, and any later evaluation of its weights, e.g. claims/skip_eval)."""
    dtype = autocast_dtype(cfg)
    return (lambda: torch.autocast(device.type, dtype=dtype)) if dtype else contextlib.nullcontext


def attn_fp32_active(cfg) -> bool:
    """Whether ``attn_fp32`` changes anything: it is set and there is an autocast to keep the kernel out of (the
    run spec's ``attn_fp32``, config/spec.py)."""
    return spec_of(cfg).attn_fp32


def precision_name(cfg) -> str:
    """``bf16``, ``bf16, attention fp32`` (attn_fp32 under autocast) or ``fp32``: the start-up line's words."""
    return f"{spec_of(cfg).precision}{', attention fp32' if attn_fp32_active(cfg) else ''}"


def check_device(precision: str, device: torch.device) -> None:
    """Refuse a precision ``device`` cannot train in (ConfigError, one line): fp16 off CUDA (its GradScaler),
    bf16 on a GPU without bf16 arithmetic (before compute capability 8.0, where torch emulates it slowly)."""
    if precision == "fp16" and device.type != "cuda":
        raise ConfigError("precision=fp16 needs a CUDA GPU (GradScaler); on CPU use precision=auto, fp32 or bf16")
    if precision == "bf16" and device.type == "cuda" and not cuda_has_bf16():
        name = torch.cuda.get_device_name(device)
        raise ConfigError(f"precision=bf16: this GPU ({name}) has no bf16 arithmetic; use precision=auto, fp16 or fp32")


def enable_tf32() -> None:
    """TF32 for fp32 matmuls and convolutions on CUDA (what autocast leaves in fp32, or all of an fp32 run). torch
    2.9 and later set it per backend (``fp32_precision``); older ones by the ``allow_tf32`` flags."""
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        torch.backends.cudnn.conv.fp32_precision = "tf32"
    else:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


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
