"""A rough time for a planned sweep, for ``reproduce --dry-run``: FLOPs over this machine's speed.

Per job: the training FLOPs (``6 N + 12 L d T`` per token, :mod:`normbench.runtime.flops`, times the
tokens of ``trainer.max_steps`` steps, plus a third of that per token for the evaluations' forward
passes) over a sustained rate, plus a start-up cost. The rate on a GPU is 35% of its bf16 peak (a
typical MFU for these models); on a CPU it is the fp32 matrix-multiply speed of this machine
(256 x 256 products on the threads the runs get: the tiny model trains at about that rate, 46 GFLOP/s
against 45 measured on one thread of the development machine), calibrated once per machine and torch
version (the median of five 0.2 s measurements) and cached (:func:`calibration`): one 0.2 s measurement
per call on a loaded machine gave the same dry run 3.5 h to 27.8 h. The estimate states the load the
calibration was made at. Each step costs at least
:data:`STEP_FLOOR_S` (the trainer's per-step overhead), each job :data:`START_S` and each sweep
:data:`SWEEP_START_S`. Set against the issue's 12-job tiny sweep (150 steps, 2 blocks: 48 s, estimated
50 s); the estimate says "about" and is meant for planning, within a factor of two.
"""

from __future__ import annotations

import functools
import json
import math
import os
import platform
import socket
import statistics
import time
from pathlib import Path

START_S = 1.0  # per job: data cache, model build, final checkpoint and summary
SWEEP_START_S = 3.0  # per sweep: the process, imports, Hydra's composition
STEP_FLOOR_S = 0.006  # the trainer's per-step overhead on a CPU (optimizer, logging), measured on model=tiny
GPU_MFU = 0.35
CPU_EFFICIENCY = 1.0
VOCAB = {"byte": 256, "gpt2": 50257}


CALIBRATION_REPEATS = 5  # median of this many 0.2 s measurements
CALIBRATION_S = 0.2


def cache_file() -> Path:
    """Where the calibration is kept: ``$NORMBENCH_CACHE/calibration.json``, else ~/.cache/normbench/."""
    root = os.environ.get("NORMBENCH_CACHE") or Path.home() / ".cache" / "normbench"
    return Path(root) / "calibration.json"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_key() -> str:
    """What the rate depends on: the host, its CPU model, torch's version and its thread setting."""
    import torch

    return f"{socket.gethostname()} | {_cpu_model()} | torch {torch.__version__} | {torch.get_num_threads()} threads"


def _measure_once() -> float:
    """FLOP/s of fp32 256 x 256 matrix products for :data:`CALIBRATION_S`, at torch's thread setting."""
    import torch

    a, b = torch.randn(256, 256), torch.randn(256, 256)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < CALIBRATION_S:
        a @ b
        n += 1
    return 2 * 256**3 * n / (time.perf_counter() - start)


def _calibrate() -> dict:
    from normbench.claims.benchmark import machine_load

    before = machine_load()
    rates = [_measure_once() for _ in range(CALIBRATION_REPEATS)]
    return {"flops": statistics.median(rates), "repeats": rates, "measured": time.strftime("%Y-%m-%d %H:%M"),
            "loadavg": before["loadavg"], "cpu_count": before["cpu_count"]}  # fmt: skip


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
    """FLOP/s of fp32 256 x 256 matrix products on this machine, at torch's thread setting (calibrated)."""
    return float(calibration()["flops"])


def calibration_note(where: str) -> str:
    """``; CPU speed calibrated 2026-12-04 22:45 at load 3.1 on 2 cores`` for a CPU estimate, else ''."""
    if where != "CPU":
        return ""
    c = calibration()
    load = f"at load {c['loadavg'][0]:.1f} on {c['cpu_count']} cores" if c.get("loadavg") else "(load unknown)"
    return f"; CPU speed calibrated {c.get('measured', '?')} {load}"


def _rate(cfg) -> tuple[float, str]:
    import torch

    from normbench.runtime.flops import gpu_peak_flops

    if cfg.device != "cpu" and torch.cuda.is_available():
        peak = cfg.peak_flops or gpu_peak_flops(torch.cuda.get_device_name(0)) or 100e12
        return GPU_MFU * peak, "GPU"
    return CPU_EFFICIENCY * cpu_rate(), "CPU"


def job_seconds(cfg) -> tuple[float, str]:
    """(seconds, "CPU"/"GPU") one job of the composed config ``cfg`` takes here, roughly."""
    from normbench.runtime.length import run_steps
    from normbench.runtime.memory import count_params

    m, t = cfg.model, cfg.trainer
    vocab = m.vocab_size or cfg.data.vocab_size or VOCAB.get(str(cfg.data.tokenizer), 50257)
    params, _ = count_params(cfg, int(vocab))
    per_token = 6.0 * params + 12.0 * m.n_layer * m.d_model * m.seq_len
    steps = run_steps(cfg)
    step_tokens = t.batch_size * t.grad_accum * m.seq_len
    evals = math.ceil(steps / max(1, t.eval_every)) + 1
    flops = per_token * (steps * step_tokens + evals * t.eval_batches * t.batch_size * m.seq_len / 3)
    rate, where = _rate(cfg)
    floor = STEP_FLOOR_S * steps if where == "CPU" else 0.0
    return START_S + max(flops / rate, floor), where


def spoken(seconds: float) -> str:
    """``about 40 s``, ``about 3 min``, ``about 2.5 h``."""
    if seconds < 90:
        return f"about {max(5, round(seconds / 5) * 5):.0f} s"
    if seconds < 90 * 60:
        return f"about {seconds / 60:.0f} min"
    return f"about {seconds / 3600:.1f} h"
