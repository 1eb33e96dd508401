"""The bench's shared timing core: a normbench run timed as the trainer times it, the interleaving of
configurations (A B A B ...: machine noise hits all alike), and the isolated run (``--worker``: one
training in a fresh process, so its peak memory and compile time are its own).

Timing excludes the first ``WARMUP`` steps, evaluation and checkpointing, as summary.json's tokens_per_s does.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench import REPO
from normbench.config.files import compose_config as compose
from normbench.model import padded_vocab
from normbench.runtime.throughput import WARMUP_STEPS as WARMUP  # the trainer's untimed steps
from normbench.train import trainer as nb_trainer
from normbench.validation import ARCHS  # noqa: F401  (the registered archs, for the CLI)

SCRIPT = REPO / "scripts" / "bench_throughput.py"  # a worker is this script again, with --worker
RESULT = "BENCH_RESULT "  # the line a --worker prints its result on


def normbench_run(overrides: list[str], steps: int) -> dict:
    cfg = compose(
        [
            *overrides,
            f"trainer.max_steps={steps}",
            "trainer.eval_every=100000",
            "trainer.ckpt_every=100000",
            "trainer.log_every=10",
            "logger=jsonl",
        ]
    )
    with tempfile.TemporaryDirectory() as tmp:
        summary = nb_trainer.run(cfg, Path(tmp))
    return summary


def interleaved(configs: dict, repeats: int) -> dict[str, float]:
    """Median tokens/s per named config; each config is a zero-arg callable returning tokens/s."""
    results: dict[str, list[float]] = {name: [] for name in configs}
    for _ in range(repeats):
        for name, fn in configs.items():
            results[name].append(fn())
    return {name: statistics.median(v) for name, v in results.items()}


def quiet_logs() -> None:
    import logging

    logging.getLogger("normbench").disabled = True


# ------------------------------------------------------- isolated runs (worker)
def _proc_status(key: str) -> float | None:
    """A /proc/self/status field in bytes (VmRSS, VmHWM), None where there is no /proc."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _reset_peak_rss() -> bool:
    """Reset this process's peak RSS (VmHWM) to its current RSS (Linux: clear_refs 5)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def worker(spec: dict) -> dict:
    """One training run in this (fresh) process: its summary, peak memory and memory estimate.

    Peak memory: on CUDA ``torch.cuda.max_memory_allocated``; on CPU the growth of the
    resident set (peak RSS during the run minus RSS before it: the interpreter and torch are
    not counted), which is what the estimate of ``normbench.runtime.memory`` covers.
    """
    from normbench.data.corpus import load_data
    from normbench.runtime import memory

    quiet_logs()
    overrides, steps = spec["overrides"], spec["steps"]
    cfg = compose(overrides)
    vocab = padded_vocab(cfg, load_data(cfg.data, log=lambda *a: None).vocab_size)
    est = memory.estimate(cfg, vocab, cfg.device if cfg.device != "auto" else "cpu").total
    cuda = cfg.device == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        before = 0.0
    else:
        reset = _reset_peak_rss()
        before = _proc_status("VmRSS") if reset else None
    cpu_time = _count_cpu_time() if not cuda else None
    summary = normbench_run(overrides, steps)
    if cpu_time is not None and cpu_time["steps"]:
        tokens = cfg.trainer.batch_size * cfg.trainer.grad_accum * cfg.model.seq_len * cpu_time["steps"]
        summary["cpu_tokens_per_s"] = tokens / cpu_time["seconds"]
    if cuda:
        peak = float(torch.cuda.max_memory_allocated())
    else:
        hwm = _proc_status("VmHWM")
        peak = hwm - before if hwm is not None and before is not None else None
    return {"summary": summary, "peak_mem": peak, "mem_estimate": est}


def _count_cpu_time() -> dict:
    """Count this process's CPU time (``time.process_time``) over the steady-state steps (after
    ``WARMUP``): forward, backward, clip, optimizer step and nGPT's re-normalization, as the
    wall-clock tokens/s does. With one torch thread, tokens per CPU-second hardly depends on what
    else the machine runs, where tokens per wall-second does (both are printed)."""
    acc = {"steps": 0, "seconds": 0.0, "calls": 0, "t0": 0.0}
    cls = nb_trainer.Trainer
    train_step, optimizer_step = cls.train_step, cls.optimizer_step

    def timed_train_step(self, *a, **k):
        acc["t0"] = time.process_time()
        return train_step(self, *a, **k)

    def timed_optimizer_step(self, *a, **k):
        out = optimizer_step(self, *a, **k)
        acc["calls"] += 1
        if acc["calls"] > WARMUP:
            acc["steps"] += 1
            acc["seconds"] += time.process_time() - acc["t0"]
        return out

    cls.train_step, cls.optimizer_step = timed_train_step, timed_optimizer_step
    return acc


def isolated(overrides: list[str], steps: int, env: dict | None = None) -> dict:
    """:func:`worker` in a subprocess; raises with its output when it fails."""
    spec = json.dumps({"overrides": overrides, "steps": steps})
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--worker", spec],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT):
            return json.loads(line[len(RESULT) :])
    raise RuntimeError(f"worker {overrides} failed ({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")


def _common(args, compile_: bool | None = None) -> list[str]:
    out = [
        f"model={args.model}",
        "norm=rmsnorm",
        "diag=off",
        f"trainer.batch_size={args.batch}",
        f"device={args.device}",
        f"precision={args.precision}",
        f"compile={str(args.compile if compile_ is None else compile_).lower()}",
    ]
    if args.device == "cuda":
        out.append("data.tokenizer=gpt2")
    return out + args.set


def _mb(b: float | None) -> str:
    return "n/a" if b is None else f"{b / 2**20:,.0f} MB"
