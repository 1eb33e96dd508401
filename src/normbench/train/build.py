"""Everything a run trains with, built in one place from the config (torchtitan's ``train.py`` setup).

:func:`build` checks the config against this machine (device, world size, memory), loads the data,
builds and wraps the model (DDP / FSDP2 / torch.compile: distributed.py) and its optimizer, and
returns them as one :class:`Components`; the trainer only runs them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch

from normbench.config import lr_rule
from normbench.config.schema import as_dict
from normbench.config.spec import RunLength, spec_of
from normbench.data.batches import Batches, fixed_batches
from normbench.data.corpus import TokenData, load_data
from normbench.diag.diagnostics import Diagnostics
from normbench.errors import ConfigError
from normbench.model import build_model, padded_vocab
from normbench.model.stabilizers import QKClip
from normbench.optim.optimizers import OptimizerList, build_optimizer
from normbench.run.rundir import RunDir
from normbench.runtime import distributed as dist_utils
from normbench.runtime import length, memory, precision
from normbench.runtime.flops import model_flops_per_token, peak_flops
from normbench.validation import run_length

log = logging.getLogger("normbench")

VAL_SEED, DIAG_SEED = 1234, 4321  # the fixed validation and diagnostic windows, the same for every run


def setup_logging(run_dir: Path, rank: int) -> None:
    """Console and ``train.log`` on rank 0; other ranks stay quiet."""
    root = logging.getLogger("normbench")
    root.setLevel(logging.INFO)
    root.propagate = False
    for h in list(root.handlers):
        root.removeHandler(h)
        h.close()
    if rank != 0:
        return
    fmt = logging.Formatter("[%(asctime)s] %(message)s", datefmt="%H:%M:%S")
    console = logging.StreamHandler(sys.stdout)
    console.setFormatter(fmt)
    file = logging.FileHandler(RunDir(run_dir).log_path)
    file.setFormatter(fmt)
    root.addHandler(console)
    root.addHandler(file)


def resolve_device(cfg) -> torch.device:
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device=cuda but no CUDA GPU is available here; use device=cpu or device=auto")
    if cfg.device == "cpu" or (cfg.device == "auto" and not torch.cuda.is_available()):
        device = torch.device("cpu")
    else:
        device = torch.device("cuda", dist_utils.local_rank() % torch.cuda.device_count())  # 1 GPU/task: cuda:0
    precision.check_device(spec_of(cfg).precision, device)  # bf16 on a GPU without it, fp16 on CPU: one line
    return device


def _log_execution(cfg, device: torch.device) -> None:
    """The start-up lines of the run's execution form, as the spec resolved it (config/spec.py); TF32 on CUDA."""
    spec = spec_of(cfg)
    log.info("precision: %s (%s)", precision.precision_name(cfg), spec.precision_source)
    log.info("compile: %s (%s)", str(spec.compile).lower(), spec.compile_source)
    if device.type == "cuda":
        precision.enable_tf32()  # what stays fp32 (all of an fp32 run, the norms' statistics) multiplies in TF32


def plain(node, **resolved) -> SimpleNamespace:
    """A config section as a plain namespace (a copy: the loop's reads never touch the config, and an OmegaConf
    read costs microseconds), with ``resolved`` values in place of what the section leaves to a rule."""
    return SimpleNamespace(**{**as_dict(node), **resolved})


def make_scaler(device: torch.device, name: str):
    """fp16's loss scaler (on CUDA; the config refuses fp16 elsewhere)."""
    return torch.amp.GradScaler(device.type) if name == "fp16" else None


@dataclass
class Components:
    device: torch.device
    data: TokenData  # train/val token arrays, vocab size
    vocab: int
    raw_model: torch.nn.Module  # the GPT itself (sharded in place under FSDP)
    model: torch.nn.Module  # what the step calls: raw_model wrapped by DDP / FSDP2 / torch.compile
    optimizer: OptimizerList  # one optimizer per kind of parameter, stepped together
    qk_clip: QKClip | None  # under optim.qk_clip=true
    scaler: torch.amp.GradScaler | None  # under fp16
    autocast: Callable[[], contextlib.AbstractContextManager]  # the forward's precision context, made per use
    batches: Batches
    val_batches: list
    diag: Diagnostics
    settings: SimpleNamespace  # cfg.trainer, plain (grad_accum, log_every, grad_clip, ...)
    sched: SimpleNamespace  # cfg.sched, plain
    length: RunLength  # the spec's (config/spec.py): max steps, N, warmup, init std; checked against the model
    tokens_per_step: int
    n_params: int
    flops_per_token: float
    peak_flops: float | None
    compiled: bool  # whether the step runs under torch.compile (compile=true, or compile=auto's decision)


def build(cfg, rank: int, world: int, notes: list[str]) -> Components:
    """Build what the run trains with from a config validation.prepare returned (its resolved spec, and the
    start-up ``notes`` it logs); ConfigError when this machine cannot run it (device, world size, memory)."""
    t, T = cfg.trainer, cfg.model.seq_len
    device = resolve_device(cfg)
    _log_execution(cfg, device)
    if t.grad_accum % world:
        raise ConfigError(
            f"trainer.grad_accum={t.grad_accum} must be a multiple of the world size ({world}) "
            f"so the global batch stays what the config says (e.g. trainer.grad_accum="
            f"{world * -(-t.grad_accum // world)})"
        )
    torch.manual_seed(cfg.seed)
    for note in notes:
        log.info("note: %s", note)
    data = load_data(cfg.data, log=log.info)
    if len(data.val) <= T + 1:
        raise ConfigError(
            f"model.seq_len={T} is longer than the validation split ({len(data.val)} tokens); "
            "lower model.seq_len or raise data.val_fraction"
        )
    vocab = padded_vocab(cfg, data.vocab_size)
    memory.check(cfg, vocab, device, log=log.info, world=world)  # refuse what cannot fit
    raw_model, model, n_params, run_len, flops_per_token, compiled = _build_model(cfg, vocab, device)
    _log_length(cfg, run_len, len(data.train))
    if world > 1:
        torch.manual_seed(cfg.seed + 1_000_003 * rank)  # dropout differs per rank; init did not
    optimizer = build_optimizer(raw_model, cfg, log=log.info)
    log.info("%s", lr_rule.describe(spec_of(cfg).kind_lrs, spec_of(cfg).lr_source))  # beside the init and length
    batches, val_batches, diag = _batches_and_diagnostics(cfg, data, raw_model, device)
    return Components(
        device=device,
        data=data,
        vocab=vocab,
        raw_model=raw_model,
        model=model,
        optimizer=optimizer,
        qk_clip=QKClip.from_config(cfg, raw_model),  # None unless optim.qk_clip=true
        scaler=make_scaler(device, spec_of(cfg).precision),
        autocast=precision.autocast(cfg, device),
        batches=batches,
        val_batches=val_batches,
        diag=diag,
        settings=plain(cfg.trainer),
        sched=plain(cfg.sched, warmup_steps=run_len.warmup_steps),  # the warmup as the spec resolved it
        length=run_len,
        tokens_per_step=t.batch_size * t.grad_accum * T,
        n_params=n_params,
        flops_per_token=flops_per_token,
        peak_flops=peak_flops(device, cfg.peak_flops),
        compiled=compiled,
    )


def checked_length(cfg, raw_model: torch.nn.Module) -> RunLength:
    """The spec's length (validation.prepare counted N at the config's vocabulary), checked against the model
    built at the data's: a BPE trained to fewer tokens than ``data.vocab_size`` gives a smaller model, whose N
    then decides (re-resolved by the same rule, and said); the spec is updated so every reader sees one value."""
    n, planned = length.count_matrices(raw_model), cfg.spec.length
    if planned.length_params == n:
        return planned
    log.info(
        "note: the data's vocabulary gives %s weight-matrix params, not %s: the length follows it",
        f"{n:,}",
        f"{planned.length_params:,}",
    )
    cfg.spec = dataclasses.replace(cfg.spec, length=run_length(cfg, n))
    return cfg.spec.length


def _log_length(cfg, run_len: RunLength, corpus_tokens: int) -> None:
    """The start-up line of the run's length, with the passes over the training tokens it makes (a warning
    past 4: runtime/length.passes)."""
    n_passes, too_many = length.passes(run_len.max_steps * length.tokens_per_step(cfg), corpus_tokens)
    log.info("%s; %.2f passes over the training tokens", run_len.source, n_passes)
    if too_many:
        log.warning("warning: %s", too_many)


def _build_model(cfg, vocab: int, device: torch.device):
    """The model on ``device`` (logged with its size and init), its length (the spec's, checked against it) and
    what the step calls (wrapped)."""
    raw_model = build_model(cfg, vocab).to(device)
    n_params = raw_model.num_params()
    run_len = checked_length(cfg, raw_model)
    log.info(
        "model: arch=%s norm=%s  %d layers, d_model %d, %d heads, seq %d, vocab %d  ->  %s params, init std %.4g (%s)",
        *(cfg.arch.name, cfg.norm.name, cfg.model.n_layer, cfg.model.d_model, cfg.model.n_head),
        *(cfg.model.seq_len, vocab, f"{n_params:,}", run_len.init_std, f"model.init_std={cfg.model.init_std}"),
    )
    flops_per_token = model_flops_per_token(raw_model, cfg.model)
    model, compiled = dist_utils.wrap_model(raw_model, cfg, device, log=log.info)
    return raw_model, model, n_params, run_len, flops_per_token, compiled


def _batches_and_diagnostics(cfg, data, raw_model, device: torch.device):
    """The training stream, the fixed validation windows and the diagnostics on their fixed batch."""
    t, T = cfg.trainer, cfg.model.seq_len
    batches = Batches(data.train, t.batch_size, T, cfg.seed, device)
    # on the device once (a few MB): no evaluation copies or waits for them; on CPU the same tensors
    val_batches = [b.to(device) for b in fixed_batches(data.val, t.eval_batches, t.batch_size, T, seed=VAL_SEED)]
    diag = Diagnostics(cfg.diag, raw_model, fixed_batches(data.val, 1, cfg.diag.batch, T, DIAG_SEED)[0])
    if diag.enabled and dist_utils.effective_parallel(cfg) == "fsdp":
        log.info("note: diagnostics are off under parallel=fsdp (they read sharded parameters); use parallel=ddp")
        diag.enabled = False
    return batches, val_batches, diag
