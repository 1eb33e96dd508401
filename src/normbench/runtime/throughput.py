"""Throughput: tokens/s of the log window and of the steady state, MFU's input, and the ETA.

As torchtitan's metrics logger: the window since the last log line gives the console's tokens/s;
the steady state (every step from the sixth of each process segment on, diagnostics included,
evaluations and checkpoints not) gives the summary's ``tokens_per_s`` and ``step_time_s``. The
steady-state clock and the wall clock go on across a resume: :meth:`Throughput.state_dict` is
the ``clock`` entry of a checkpoint (train/state.py).
"""

from __future__ import annotations

import time

import torch

WARMUP_STEPS = 5  # untimed steps at the start of each segment (allocator, compile, caches)
SPENT = ("eval_s", "ckpt_s", "diag_s")  # where the wall clock goes besides the steps, each summed over the run


class Throughput:
    def __init__(self, tokens_per_step: int, device: torch.device):
        self.tokens_per_step, self.device = tokens_per_step, device
        # the seconds apart from training steps (summary.json's eval_s, ckpt_s, diag_s): :meth:`spent`
        self.clock = {"wall_s": 0.0, "train_time": 0.0, "train_tokens": 0, **dict.fromkeys(SPENT, 0.0)}
        self.window_time, self.window_tokens = 0.0, 0
        self.start_wall = time.perf_counter()
        self.first_step, self.t0, self.timed = 0, 0.0, False

    # -------------------------------------------------------------- the clock a checkpoint carries
    def state_dict(self) -> dict:
        return {**self.clock, "wall_s": time.perf_counter() - self.start_wall}

    def load_state_dict(self, clock: dict) -> None:
        self.clock.update(clock)

    # ------------------------------------------------------------------------------ per step
    def start(self, step: int) -> None:
        """The loop begins at ``step``: the wall clock continues from the checkpoint's."""
        self.start_wall = time.perf_counter() - self.clock["wall_s"]
        self.first_step = step

    def step_start(self, step: int) -> None:
        if self.device.type == "cuda" and step - self.first_step == WARMUP_STEPS:
            torch.cuda.synchronize()  # the untimed first steps' queued GPU work must not leak into the timing
        self.timed = step - self.first_step >= WARMUP_STEPS
        self.t0 = time.perf_counter()

    def step_end(self, sync: bool) -> None:
        """The step's time (``sync``: a log step on CUDA waits for the GPU first)."""
        if sync and self.device.type == "cuda":
            torch.cuda.synchronize()
        self.add(time.perf_counter() - self.t0, self.tokens_per_step)

    def add(self, seconds: float, tokens: int = 0) -> None:
        """Training-time cost (a step, or the diagnostic forward of a log step)."""
        if self.timed:
            self.clock["train_time"] += seconds
            self.clock["train_tokens"] += tokens
        self.window_time += seconds
        self.window_tokens += tokens

    def spent(self, what: str, seconds: float) -> None:
        """Wall seconds of evaluation (``eval_s``), checkpoints (``ckpt_s``) or diagnostics (``diag_s``), summed
        over the run (across a resume too), so summary.json says where the time outside the steps went."""
        self.clock[what] += seconds

    def window(self) -> tuple[float, float]:
        """(tokens/s, s/step) since the last call; starts a new window."""
        tps = self.window_tokens / max(self.window_time, 1e-9)
        step_time = self.window_time * self.tokens_per_step / max(self.window_tokens, 1)
        self.window_time, self.window_tokens = 0.0, 0
        return tps, step_time

    def steady(self) -> tuple[float | None, float | None]:
        """(tokens/s, s/step) of the steady state so far; None before a timed step."""
        tokens, seconds = self.clock["train_tokens"], self.clock["train_time"]
        tps = tokens / seconds if seconds > 0 else None
        return tps, (seconds * self.tokens_per_step / tokens) if tokens else None

    def wall(self) -> float:
        return time.perf_counter() - self.start_wall


class Eta:
    """Time left: an exponential moving average of the wall time per step between log lines (evals,
    checkpoints and diagnostics included, as the rest of the run will have them), so the ETA does not
    jump with each window's mix of steps."""

    def __init__(self, weight: float = 0.3):
        self.weight, self.per_step, self.last = weight, None, None

    def remaining(self, step: int, max_steps: int, step_time_now: float) -> float:
        now = time.perf_counter()
        if self.last is not None and step > self.last[0]:
            rate = (now - self.last[1]) / (step - self.last[0])
            self.per_step = rate if self.per_step is None else (1 - self.weight) * self.per_step + self.weight * rate
        self.last = (step, now)
        return (max_steps - step) * (self.per_step if self.per_step is not None else step_time_now)


def fmt(x, spec: str = ".4f") -> str:
    return "n/a" if x is None else format(x, spec)


def fmt_time(seconds: float) -> str:
    seconds = int(seconds)
    return (
        f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"
    )
