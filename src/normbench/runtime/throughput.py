"""Throughput: tokens/s of the log window and of the steady state, MFU's input, and the ETA.

Measured as nanoGPT and torchtitan do, from the wall clock: a window runs from one log step's sync to the
next one's, so everything the loop does in between (the steps, the stop votes, data loading, the diagnostics'
extra forward, a wait at a lagged read) is inside it, and a GPU's queued work is finished at both ends. The
seconds spent in evaluations and checkpoints (each timed from a sync: the trainer) are taken out of the window
they fell in: they are the summary's ``eval_s`` and ``ckpt_s``, not training. So the rate is tokens over the
wall time they took, and MFU (runtime/flops.mfu) cannot exceed what the device did: above 100% only with a
peak below the device's real one.

The steady state (the summary's ``tokens_per_s`` and ``step_time_s``) is the same clock from the sixth step of
each process segment on (a sync there too: allocator warm-up, compiling and caches stay out). The steady-state
clock and the wall clock go on across a resume: :meth:`Throughput.state_dict` is the ``clock`` entry of a
checkpoint (train/state.py). The clock and the device sync are injectable (tests use a fake clock).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

import torch

WARMUP_STEPS = 5  # untimed steps at the start of each segment (allocator, compile, caches)
SPENT = ("eval_s", "ckpt_s", "diag_s")  # where the wall clock goes besides the steps, each summed over the run
NOT_TRAINING = ("eval_s", "ckpt_s")  # taken out of the window they fall in (diagnostics count as training)


def device_sync(device: torch.device) -> Callable[[], None]:
    """What waits for ``device``'s queued work: ``torch.cuda.synchronize`` on a GPU, nothing on CPU."""
    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)


class Throughput:
    def __init__(self, tokens_per_step: int, device: torch.device, clock=time.perf_counter, sync=None):
        self.tokens_per_step, self.now = tokens_per_step, clock
        self.sync = sync if sync is not None else device_sync(device)
        # the seconds apart from training steps (summary.json's eval_s, ckpt_s, diag_s): :meth:`spent`
        self.clock = {"wall_s": 0.0, "train_time": 0.0, "train_tokens": 0, **dict.fromkeys(SPENT, 0.0)}
        self.start_wall = self.now()
        self.first_step, self.timed = 0, False
        self.mark = (self.start_wall, 0, 0.0)  # (time, step, eval+ckpt seconds) at the last sync
        self.window_time, self.window_tokens = 0.0, 0

    # -------------------------------------------------------------- the clock a checkpoint carries
    def state_dict(self) -> dict:
        return {**self.clock, "wall_s": self.now() - self.start_wall}

    def load_state_dict(self, clock: dict) -> None:
        self.clock.update(clock)

    # ------------------------------------------------------------------------------ per step
    def start(self, step: int) -> None:
        """The loop begins at ``step``: the wall clock continues from the checkpoint's."""
        now = self.now()
        self.start_wall = now - self.clock["wall_s"]
        self.first_step, self.timed = step, False
        self.mark = (now, step, self._not_training())

    def step_start(self, step: int) -> None:
        """Before ``step``'s work: after the segment's untimed first steps, the steady state starts here."""
        if not self.timed and step - self.first_step >= WARMUP_STEPS:
            self._interval(step)  # into the window only
            self.timed = True

    def window(self, step: int) -> tuple[float, float]:
        """At a log step (``step`` done): wait for the device, then (tokens/s, s/step) since the previous log step,
        its evaluation and checkpoint seconds left out; starts a new window."""
        self._interval(step)
        tps = self.window_tokens / max(self.window_time, 1e-9)
        step_time = self.window_time * self.tokens_per_step / max(self.window_tokens, 1)
        self.window_time, self.window_tokens = 0.0, 0
        return tps, step_time

    def _interval(self, step: int) -> None:
        """Close the interval since the last mark at a sync: its training seconds and tokens go to the window, and
        to the steady state once timed."""
        self.sync()
        now, spent = self.now(), self._not_training()
        t0, step0, spent0 = self.mark
        seconds, tokens = max(0.0, now - t0 - (spent - spent0)), (step - step0) * self.tokens_per_step
        self.window_time += seconds
        self.window_tokens += tokens
        if self.timed:
            self.clock["train_time"] += seconds
            self.clock["train_tokens"] += tokens
        self.mark = (now, step, spent)

    def _not_training(self) -> float:
        return sum(self.clock[k] for k in NOT_TRAINING)

    @contextlib.contextmanager
    def spending(self, what: str) -> Iterator[None]:
        """The block's wall seconds, on this meter's clock, added to ``what`` (:meth:`spent`)."""
        began = self.now()
        try:
            yield
        finally:
            self.spent(what, self.now() - began)

    def spent(self, what: str, seconds: float) -> None:
        """Wall seconds of evaluation (``eval_s``), checkpoints (``ckpt_s``) or diagnostics (``diag_s``), summed
        over the run (across a resume too), so summary.json says where the time outside the steps went."""
        self.clock[what] += seconds

    def steady(self) -> tuple[float | None, float | None]:
        """(tokens/s, s/step) of the steady state so far; None before a timed step."""
        tokens, seconds = self.clock["train_tokens"], self.clock["train_time"]
        tps = tokens / seconds if seconds > 0 else None
        return tps, (seconds * self.tokens_per_step / tokens) if tokens else None

    def wall(self) -> float:
        return self.now() - self.start_wall


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
