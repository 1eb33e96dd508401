"""A rough time for a planned sweep, for ``reproduce --dry-run``: FLOPs over this machine's speed.

Per job: the training FLOPs (``6 N + 12 L d T`` per token, :mod:`normbench.runtime.flops`, times the
tokens of ``trainer.max_steps`` steps, plus a third of that per token for the evaluations' forward
passes) over a sustained rate, plus a start-up cost. The rate on a GPU is 35% of its bf16 peak (a
typical MFU for these models). On a CPU it is measured, not assumed: the model FLOP/s of the miniature's
own eager fp32 training step (``model=tiny``, 4 blocks, Pre-LN + LayerNorm, batch 16: the step the paired
benchmark times, claims/benchmark.model_stepper) on **one** torch thread, the thread a claim's run gets
under ``jobs=2``; times the trainer's share (:data:`TRAINER_SHARE`: diagnostics and logging between steps) and
the run's execution form's speed over eager fp32 (:data:`FORM_SPEEDUP`, measured side by
side in docs/performance.md §7). So the estimate is in CPU-seconds: one thread's time, which is what two
runs at a time on two cores each take. An earlier version used the 256 x 256 fp32 matmul rate on all
threads: the miniature trains at about a third of that per thread, so it underestimated by 2-6x with the
load. The rate is calibrated once per machine and torch version (the median of five 0.2 s measurements)
and cached (:func:`calibration`): one measurement per call on a loaded machine gave the same dry run
3.5 h to 27.8 h. The estimate states the load the calibration was made at. Each job costs :data:`START_S`
and each sweep :data:`SWEEP_START_S`; a compiled run adds its compile time (runtime/compiling.py). It is
meant for planning, within a factor of two.
"""

from __future__ import annotations

import functools
import json
import math
import os
import socket
import statistics
import time
from pathlib import Path

from normbench.config.files import compose_config
from normbench.runtime.cpu import cpu_model
from normbench.runtime.length import run_steps

START_S = 1.0  # per job: data cache, model build, final checkpoint and summary
SWEEP_START_S = 3.0  # per sweep: the process, imports, Hydra's composition
GPU_MFU = 0.35
# The trainer's tokens per CPU-second over the bare step's (claims/benchmark.model_stepper) on the miniature, its
# evaluations counted apart (above): measured 1.05 (400 eager fp32 steps of tiny in 25.8 CPU-s of `normbench
# train` beyond start-up, against 27.0 s from the step's rate measured right after): diagnostics, logging and
# batching cost next to nothing, so 1.
TRAINER_SHARE = 1.0
# tokens per CPU-second of each execution form over eager fp32 on the miniature, keyed (compiled, precision,
# attn_fp32), for a CPU with native bf16 products and for one without (runtime/precision.cpu_native_bf16):
# docs/performance.md §7, paired, tiny 4 blocks (8 blocks within 4%). With native bf16 (a Xeon with avx512_bf16);
# wider models gain more from bf16 (d 256: 1.64x compiled), so the estimate errs long there. Without it (an AVX2-only
# AMD EPYC, whose bf16 matmul ran at 2-6% of its fp32 rate), every bf16 form runs at a fifth of eager fp32. A form not
# listed counts as eager fp32.
FORM_SPEEDUP = {
    True: {
        (False, "fp32", False): 1.0, (True, "fp32", False): 1.25,
        (False, "bf16", False): 0.68, (True, "bf16", False): 0.81,
        (False, "bf16", True): 1.24, (True, "bf16", True): 1.71,
    },
    False: {
        (False, "fp32", False): 1.0, (True, "fp32", False): 1.29,
        (False, "bf16", False): 0.19, (True, "bf16", False): 0.19,
        (False, "bf16", True): 0.19, (True, "bf16", True): 0.20,
    },
}  # fmt: skip
VOCAB = {"byte": 256, "gpt2": 50257}


CALIBRATION_REPEATS = 5  # median of this many 0.2 s measurements
CALIBRATION_S = 0.2


def cache_file() -> Path:
    """Where the calibration is kept: ``$NORMBENCH_CACHE/calibration.json``, else ~/.cache/normbench/."""
    root = os.environ.get("NORMBENCH_CACHE") or Path.home() / ".cache" / "normbench"
    return Path(root) / "calibration.json"


def machine_key() -> str:
    """What the rate depends on: the host, its CPU model, torch's version; and what was measured (the
    miniature's step on one thread: an entry of the older matmul calibration is not read as one)."""
    import torch  # deferred (start-up time): torch

    return f"{socket.gethostname()} | {cpu_model()} | torch {torch.__version__} | miniature step, 1 thread"


@functools.lru_cache(maxsize=1)
def _miniature():
    """(step, model FLOPs per step) of the miniature's eager fp32 training step (module docstring)."""
    import torch  # deferred (start-up time): torch

    from normbench.claims.benchmark import model_stepper  # deferred (start-up time): hydra, omegaconf, numpy
    from normbench.runtime.flops import model_flops_per_token  # deferred (start-up time): torch
    from normbench.validation import to_config  # deferred (start-up time): torch, hydra, omegaconf

    cfg = to_config(compose_config(["model=tiny", "model.n_layer=4", "arch=pre_ln", "norm=layernorm"]))
    model, step = model_stepper(cfg, 256, torch.device("cpu"))
    step()  # the first step allocates the optimizer state
    return step, model_flops_per_token(model, cfg.model) * cfg.trainer.batch_size * cfg.model.seq_len


def _measure_once() -> float:
    """Model FLOP/s of the miniature's eager fp32 step for about :data:`CALIBRATION_S` CPU-seconds, one thread."""
    import torch  # deferred (start-up time): torch

    step, flops = _miniature()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        n, start = 0, time.process_time()
        while (spent := time.process_time() - start) < CALIBRATION_S:
            step()
            n += 1
    finally:
        torch.set_num_threads(threads)
    return flops * n / spent


def _calibrate() -> dict:
    from normbench.claims.benchmark import machine_load  # deferred (start-up time): hydra, omegaconf, numpy

    before = machine_load()
    rates = [_measure_once() for _ in range(CALIBRATION_REPEATS)]
    return {
        "flops": statistics.median(rates),
        "repeats": rates,
        "measured": time.strftime("%Y-%m-%d %H:%M"),
        "loadavg": before["loadavg"],
        "cpu_count": before["cpu_count"],
    }


@functools.lru_cache(maxsize=1)
def calibration() -> dict:
    """This machine's CPU rate, measured once per :func:`machine_key` (the median of
    :data:`CALIBRATION_REPEATS`) and then read from :func:`cache_file`, so that dry runs agree with each
    other whatever the machine's load at the time of each; the load when it was measured is kept with it."""
    path, key = cache_file(), machine_key()
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = {}
    if isinstance(cached, dict) and isinstance(cached.get(key), dict) and "flops" in cached[key]:
        return cached[key]
    entry = _calibrate()
    try:  # a cache that cannot be written costs a calibration per call, nothing else
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({**(cached if isinstance(cached, dict) else {}), key: entry}, indent=1))
        tmp.replace(path)
    except OSError:
        pass
    return entry


def cpu_rate() -> float:
    """Model FLOP/s of the miniature's eager fp32 step on one thread of this machine (calibrated)."""
    return float(calibration()["flops"])


def form_speedup(cfg) -> float:
    """:data:`FORM_SPEEDUP` of ``cfg``'s execution form on this kind of CPU (``compile=auto`` not yet pinned counts
    as eager)."""
    from normbench.config.spec import spec_of  # deferred (start-up time): torch, omegaconf
    from normbench.runtime.precision import (  # deferred (start-up time): torch, omegaconf
        attn_fp32_active,
        cpu_native_bf16,
    )

    form = (cfg.compile is True, spec_of(cfg).precision, attn_fp32_active(cfg))  # precision=auto as resolved here
    return FORM_SPEEDUP[cpu_native_bf16()].get(form, 1.0)


def calibration_note(where: str) -> str:
    """``; CPU speed calibrated 2026-12-04 22:45 at load 3.1 on 2 cores`` for a CPU estimate, else ''."""
    if where != "CPU":
        return ""
    c = calibration()
    load = f"at load {c['loadavg'][0]:.1f} on {c['cpu_count']} cores" if c.get("loadavg") else "(load unknown)"
    return f"; CPU speed calibrated {c.get('measured', '?')} {load}"


def _rate(cfg) -> tuple[float, str]:
    import torch  # deferred (start-up time): torch

    from normbench.runtime.flops import gpu_peak_flops  # deferred (start-up time): torch

    if cfg.device != "cpu" and torch.cuda.is_available():
        peak = cfg.peak_flops or gpu_peak_flops(torch.cuda.get_device_name(0)) or 100e12
        return GPU_MFU * peak, "GPU"
    return TRAINER_SHARE * form_speedup(cfg) * cpu_rate(), "CPU"


def job_seconds(cfg) -> tuple[float, str]:
    """(seconds, "CPU"/"GPU") one job of the composed config ``cfg`` takes here, roughly."""
    from normbench.runtime.memory import count_params  # deferred (start-up time): torch, hydra, omegaconf

    m, t = cfg.model, cfg.trainer
    vocab = m.vocab_size or cfg.data.vocab_size or VOCAB.get(str(cfg.data.tokenizer), 50257)
    params, _ = count_params(cfg, int(vocab))
    per_token = 6.0 * params + 12.0 * m.n_layer * m.d_model * m.seq_len
    steps = run_steps(cfg)
    step_tokens = t.batch_size * t.grad_accum * m.seq_len
    evals = math.ceil(steps / max(1, t.eval_every)) + 1
    flops = per_token * (steps * step_tokens + evals * t.eval_batches * t.batch_size * m.seq_len / 3)
    rate, where = _rate(cfg)
    compiling = _compile_seconds(where) if cfg.compile is True else 0.0
    return START_S + compiling + flops / rate, where


def _compile_seconds(where: str) -> float:
    """A compiled run's compiling on ``where`` (``_rate``'s "CPU"/"GPU"): warm (inductor's cache is shared by a
    claim's seeds and same-shaped runs)."""
    from normbench.runtime.compiling import PROFILES  # deferred (start-up time): torch, hydra, omegaconf

    return PROFILES["cuda" if where == "GPU" else "cpu"].warm_s


def spoken(seconds: float) -> str:
    """``about 40 s``, ``about 3 min``, ``about 2.5 h``."""
    if seconds < 90:
        return f"about {max(5, round(seconds / 5) * 5):.0f} s"
    if seconds < 90 * 60:
        return f"about {seconds / 60:.0f} min"
    return f"about {seconds / 3600:.1f} h"
