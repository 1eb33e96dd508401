"""The training loop's stateful parts: each one says when it is due and owns what a checkpoint keeps of it.

- :class:`Evaluation`: when the val loss is measured, its last and best value, and an evaluation a
  stop signal cut short (the resume does it into that step's record);
- :class:`Checkpoints`: when a checkpoint is written between log steps (the trainer writes the last one);
- :class:`LossWatch`: the per-step losses, kept on the device until a log step or a checkpoint needs
  them (a host sync per step would stall the GPU), then checked for divergence and loss spikes.

Steps are numbered as in the records: step n is the n-th optimizer step. The checkpoint keys the
parts contribute (:meth:`Evaluation.state_dict`, :meth:`LossWatch.state_dict`) are the flat keys of
docs/contract.md §3, so checkpoints of every version resume (train/state.py gathers them).
"""

from __future__ import annotations

import math
import time

import torch

from normbench.diag.diagnostics import SpikeDetector
from normbench.runtime import distributed as dist_utils


class Evaluation:
    """The validation loss: due at step 1, every ``every`` steps and at the last step."""

    def __init__(self, every: int, max_steps: int):
        self.every, self.max_steps = every, max_steps
        self.best = math.inf
        self.last: float | None = None
        self.missing = False  # a stop signal cut this step's evaluation short: the resume does it

    def due(self, step: int) -> bool:
        return step % self.every == 0 or step in (1, self.max_steps)

    def record(self, val: float | None) -> bool:
        """Keep an evaluation's loss (None: a stop signal cut it short); whether there is one."""
        self.missing = val is None
        if val is not None:
            self.last, self.best = val, min(self.best, val)
        return val is not None

    def state_dict(self) -> dict:
        return {"best_val": self.best, "last_val": self.last, "eval_missing": self.missing}

    def load_state_dict(self, state: dict) -> None:
        self.best = state.get("best_val", math.inf)
        self.last = state.get("last_val")
        self.missing = bool(state.get("eval_missing", False))


class Checkpoints:
    """A checkpoint every ``every`` steps before the last (None: none by steps; the last step always ends
    with one), at each step of ``keep`` (``trainer.save_at``), whose checkpoint is also kept as
    ``step_<k>.pt``: a branch point, and once ``every_s`` seconds of wall clock have passed since the last
    one (0: never), asked at log steps (:meth:`time_due`; the trainer has rank 0 decide for all ranks).

    Why by time: a checkpoint's cost is its write time over the interval, and the work a crash loses is the
    interval, both in seconds whatever the model and the device; a step count right for a GPU (GPT-2 124M:
    ~35 ms a step, a 1.5 GB write of ~8 s) checkpoints a CPU run hours apart, and one right for the CPU demo
    costs a GPU run more than its training (docs/contract.md §3)."""

    def __init__(self, every: int | None, max_steps: int, keep=(), every_s: float = 0.0):
        self.every, self.max_steps, self.keep, self.every_s = every, max_steps, frozenset(keep), every_s
        self.last_t = time.monotonic()

    def due(self, step: int) -> bool:
        by_steps = self.every is not None and step % self.every == 0
        return (by_steps and step < self.max_steps) or step in self.keep

    def time_due(self, step: int, device: torch.device) -> bool:
        """Whether ``every_s`` has passed (asked at log steps only). Under torchrun rank 0's clock decides for
        every rank (one small collective), so that all of them take the collective checkpoint together."""
        if not self.every_s or step >= self.max_steps:
            return False
        return dist_utils.main_says(time.monotonic() - self.last_t >= self.every_s, device)

    def saved(self) -> None:
        self.last_t = time.monotonic()


class LossWatch:
    """Per-step losses and skip flags on the device until :meth:`drain`; divergence and spike bookkeeping over them.

    A run diverges at a non-finite loss, a loss above ``diverge_factor`` x the first one, or more than
    ``max_skipped`` optimizer steps skipped for non-finite gradients. All of it is decided at the drain (a log
    step, a checkpoint), as torchtitan checks on the device and reads at log steps: a step's non-finite gradients
    or its fp16 overflow are counted on the device (:meth:`count`), so no step waits for the GPU to know.
    """

    def __init__(self, diverge_factor: float, max_skipped: int, spike: SpikeDetector):
        self.diverge_factor, self.max_skipped, self.spike = diverge_factor, max_skipped, spike
        self.pending: list[torch.Tensor] = []
        self.counts: dict[str, torch.Tensor] = {}  # {state counter: steps flagged since the last drain}
        self.initial: float | None = None

    def add(self, loss: torch.Tensor) -> None:
        self.pending.append(loss)

    def count(self, name: str, flag: torch.Tensor) -> None:
        """Count a step whose 0-dim bool ``flag`` is true toward the state's counter ``name`` (``skipped``,
        ``amp_skipped``), on the device: read at the next drain."""
        n = flag.to(torch.int64)
        self.counts[name] = self.counts[name] + n if name in self.counts else n

    def drain(self, step: int, state) -> tuple[list[float], str | None]:
        """The losses since the last drain (the last one is ``step``'s) and a divergence's reason or None; the
        skip counts since then are added to ``state``'s counters (``state.skipped``, ``state.amp_skipped``)."""
        for name, n in self.counts.items():
            setattr(state, name, getattr(state, name) + int(n.item()))
        self.counts.clear()
        if not self.pending:
            return [], None
        losses = torch.stack(self.pending).tolist()
        self.pending.clear()
        return losses, self._check(losses, step, state.skipped)

    def _check(self, losses: list[float], last_step: int, skipped: int) -> str | None:
        for step, loss in enumerate(losses, last_step - len(losses) + 1):  # step numbers as in the records
            if not math.isfinite(loss):
                return f"non-finite loss ({loss}) at step {step}"
            if self.initial is None:
                self.initial = loss
            if loss > self.diverge_factor * self.initial:
                return f"loss {loss:.3f} > {self.diverge_factor} x initial loss {self.initial:.3f}"
            self.spike.update(loss, step)
        if skipped > self.max_skipped:
            return f"{skipped} optimizer steps skipped for non-finite gradients"
        return None

    def state_dict(self) -> dict:
        return {
            "initial_loss": self.initial,
            **self.spike.state_dict(),  # spikes, recent_losses
            "spike_steps_unlogged": list(self.spike.steps),  # found since the last record (interrupt mid-interval)
        }

    def load_state_dict(self, state: dict) -> None:
        self.initial = state.get("initial_loss")
        self.spike.load_state_dict(state)
        self.spike.steps = list(state.get("spike_steps_unlogged", []))
