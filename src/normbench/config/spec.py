"""A run's resolved spec: the values its config leaves to a rule, resolved once.

``optim.lr: auto`` is a request ("the recipe's LR carried to this width", config/lr_rule.py), not a number;
``precision: auto`` and ``compile: auto`` are requests too ("the fast form where the hardware has it"), and
``attn_fp32`` matters only under an autocast (the spec says whether the attention kernel runs in fp32).
:func:`run_spec` turns them into values, here and nowhere else; :func:`normbench.validation.prepare` sets the
result on the typed config it returns (``cfg.spec``, frozen), and every reader (the optimizer builder, the
autocast, the model wrapper, the start-up lines, summary.json, the claims' dry run and LR ladder) takes the value
from there, so ``auto`` never leaves this module. A composed config that was not prepared (a claim's planned job,
a test's) gets its spec resolved by :func:`spec_of` when asked.

- ``precision: auto``: bf16 autocast on a CUDA GPU with bf16 arithmetic (compute capability 8.0 and up: the
  nanoGPT and torchtitan default), fp32 elsewhere, the CPU included (an emulated bf16 product runs at a few per
  cent of the fp32 rate on most CPUs: docs/performance.md §7). fp32 on a GPU multiplies in TF32
  (runtime/precision.enable_tf32).
- ``compile: auto``: on CUDA, compiled when the run is long enough to repay compiling (runtime/compiling.decide's
  estimate, from the model's FLOPs: validation.prepare passes it in, a layer above this package); on CPU, eager:
  a compiled run's losses agree with eager ones to ~1e-3 relative, not bit for bit, so the CPU demo and every CPU
  run of a given config stay bit-exact with today's. ``reproduce`` pins its own ``compile=auto`` to true/false per
  claim with the estimate on either device (reproduce/length.pin_compile), so a claim's jobs never reach this rule
  undecided.

The run's length, warmup and init std depend on the model: its weight-matrix count N (``trainer.tokens_per_param``,
runtime/length.py, counted on the meta device from the config's vocabulary) and its class's init rule (an arch may
override ``model.init_std``: model/gpt.py). Their rules live with the model, a layer above this package, so
:func:`normbench.validation.prepare` resolves them and fills the spec's :class:`RunLength` (``spec.length``) beside
the values resolved here, and the peak LR of each kind of parameter (``kind_lrs``: the optimizer's groups built
over the model on the meta device, muP's per-parameter multipliers applied); the trainer, the schedule, the
start-up lines and summary.json read them from there.
``spec_of`` on a config that was not prepared leaves ``length`` and ``kind_lrs`` None: its readers (the autocast,
the optimizer's scalar LR, a claim's dry run) need neither. The passes over the data are the one value left to the
build: they need the corpus's token count, known once the data is loaded (train/build.py's start-up line).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import DictConfig

from normbench.config import lr_rule

CompileRule = Callable[[Any], tuple[bool, str]]  # cfg -> (compile, why): compile=auto's estimate on CUDA


@dataclass(frozen=True)
class RunLength:
    """The run's length and the model-dependent values beside it, resolved by validation.prepare."""

    max_steps: int  # optimizer steps: trainer.max_steps, max_tokens or tokens_per_param (runtime/length.run_steps)
    length_params: int  # N of tokens_per_param: the weight matrices, embeddings and head included
    warmup_steps: int  # sched.warmup_steps, or its null resolved: 10% of the run (optim.warmup_steps)
    init_std: float  # the std the plain matrices start from, by the model class's rule (model.weight_init_std)
    source: str  # the start-up line's account of the length (runtime/length.describe)


@dataclass(frozen=True)
class RunSpec:
    lr: float  # optim.lr as the number the optimizer is built with (auto: lr_ref x lr_ref_width / width)
    lr_source: str  # where it came from: "optim.lr=auto (0.0006 x 768/64)" or "optim.lr=0.002"
    matrix_lr: float  # the hidden matrices' peak LR: lr, times muP's d_base/d for an Adam-like optimizer
    precision: str = "fp32"  # the autocast the run trains in: fp32 (none), bf16 or fp16
    precision_source: str = "precision=fp32"  # "precision=auto: bf16 (this GPU computes in bf16)"
    compile: bool = False  # whether the step runs under torch.compile
    compile_source: str = "compile=false"  # compile=auto's reason (the estimate's numbers on CUDA)
    attn_fp32: bool = False  # the attention kernel in fp32: attn_fp32=true under a bf16/fp16 autocast (else moot)
    length: RunLength | None = None  # set by validation.prepare; None on a config it did not see (spec_of)
    kind_lrs: dict | None = None  # {parameter kind: peak LR}, muP's multipliers applied: validation.prepare's too


def run_spec(cfg: Any, compile_estimate: CompileRule | None = None) -> RunSpec:
    """The resolved spec of ``cfg`` (typed or composed); ConfigError (one line) where a rule cannot apply.

    ``compile_estimate``: ``compile=auto``'s rule on CUDA (runtime/compiling.estimate_for_run, which builds the
    model on the meta device: a layer above this package, so validation.prepare passes it in)."""
    on_cuda = device_type(cfg) == "cuda"
    precision, precision_source = resolve_precision(cfg.precision, on_cuda)
    compile_on, compile_source = resolve_compile(cfg, on_cuda, compile_estimate)
    return RunSpec(
        lr=lr_rule.resolve(cfg.optim, cfg.model),
        lr_source=lr_rule.source(cfg.optim, cfg.model),
        matrix_lr=lr_rule.matrix_lr(cfg),
        precision=precision,
        precision_source=precision_source,
        compile=compile_on,
        compile_source=compile_source,
        attn_fp32=bool(getattr(cfg, "attn_fp32", False)) and precision in ("bf16", "fp16"),
    )


def spec_of(cfg: Any) -> RunSpec:
    """``cfg.spec`` as :func:`normbench.validation.prepare` set it; resolved now for a composed config that was not
    prepared (a claim's planned job, a test's config): the same rule either way."""
    spec = getattr(cfg, "spec", None) if not isinstance(cfg, DictConfig) else None
    return spec if spec is not None else run_spec(cfg)


def device_type(cfg: Any) -> str:
    """``cuda`` or ``cpu``: where ``cfg.device`` puts the run on this machine (device=cuda without a GPU is
    refused when the run is built: train/build.resolve_device)."""
    return "cuda" if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available()) else "cpu"


def cuda_has_bf16() -> bool:
    """Whether this machine's GPU computes in bf16 (Ampere and later; torch's emulation on older GPUs is slow)."""
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)


def resolve_precision(requested: str, on_cuda: bool) -> tuple[str, str]:
    """(precision, where it came from) for ``precision=requested`` on a CUDA GPU or not."""
    if requested != "auto":
        return requested, f"precision={requested}"
    if on_cuda and cuda_has_bf16():
        return "bf16", "precision=auto: bf16 autocast (this GPU computes in bf16)"
    if on_cuda:
        return "fp32", "precision=auto: fp32 with TF32 matmuls (this GPU has no bf16)"
    return "fp32", "precision=auto: fp32 on CPU"


def resolve_compile(cfg: Any, on_cuda: bool, estimate: CompileRule | None) -> tuple[bool, str]:
    """(compiled, why) for ``cfg.compile``: true/false as given; auto: ``estimate`` on CUDA, eager on CPU."""
    if cfg.compile is True or cfg.compile is False:
        return bool(cfg.compile), f"compile={str(cfg.compile).lower()}"
    if not on_cuda:
        return False, "compile=auto: eager on CPU (compiled losses are not bit-exact with eager; compile=true compiles)"
    if estimate is None:  # spec_of on a config validation.prepare did not see: no model to estimate from
        return False, "compile=auto: eager (undecided outside validation.prepare)"
    return estimate(cfg)
