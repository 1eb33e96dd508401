"""What the loop does besides the step itself, behind one small protocol (OLMo-core's trainer callbacks are the model).

A :class:`Callback` sees the step at fixed points; each hook does nothing unless a callback overrides it. In the
order a step calls them (``step``: the step running, numbered as the records number it, from 1):

- :meth:`Callback.wants_record`: whether the end of ``step`` must be a log step, because this callback writes
  into that step's record (the trainer asks before the step: a log step is a host sync, so it is planned);
- :meth:`Callback.pre_step`: before the forward/backward;
- :meth:`Callback.pre_clip`: the gradients accumulated (and unscaled), before clipping;
- :meth:`Callback.pre_optim_step`, :meth:`Callback.post_optim_step`: around the optimizer step;
- :meth:`Callback.on_record`: at a log step, after the record's own values (loss, LR, grad norm, tokens/s):
  add to the record. ``diverged`` says the run ends at this step; work that only a run going on needs is
  skipped then.

The trainer sets :attr:`Callback.trainer` before the first step. Its own callbacks are :class:`Diagnose`
(per-layer statistics, docs/contract.md §4) and :class:`Validate` (the val loss); ``normbench train`` adds
downstream tasks (downstream/callback.py) when ``eval.tasks`` names some, and a plugin may add its own
(``trainer.run(cfg, run_dir, callbacks=[...])``). Checkpoints and stop signals stay in the loop itself:
whether the loop goes on is the algorithm's decision, not an observer's.
"""

from __future__ import annotations

from typing import Any

import torch

from normbench.diag.diagnostics import Diagnostics
from normbench.train.loop_parts import Evaluation


class Callback:
    """One part of the loop's work at some steps; every hook is a no-op here."""

    trainer: Any  # the train.trainer.Trainer running it, set before the first step (that module imports this one)

    def wants_record(self, step: int) -> bool:
        return False

    def pre_step(self, step: int) -> None:
        pass

    def pre_clip(self, step: int) -> None:
        pass

    def pre_optim_step(self, step: int) -> None:
        pass

    def post_optim_step(self, step: int) -> None:
        pass

    def on_record(self, step: int, record: dict, diverged: bool) -> None:
        pass


class Diagnose(Callback):
    """The diagnostics (diag/diagnostics.py) at the first step, every ``every`` steps and the last one: hooks on
    the activations for the step's forward, per-layer gradient norms before clipping (as docs/contract.md §4
    defines them), update ratios around the optimizer step; the forward on the fixed batch at the record, timed
    as ``diag_s`` (training-time cost: it also counts in the next window's tokens/s)."""

    def __init__(self, diag: Diagnostics, every: int, max_steps: int):
        self.diag, self.every, self.max_steps = diag, every, max_steps

    def wants_record(self, step: int) -> bool:
        return self.diag.enabled and (step == 1 or step % self.every == 0 or step == self.max_steps)

    def pre_clip(self, step: int) -> None:
        if self.wants_record(step):
            self.diag.grad_norms()

    def pre_optim_step(self, step: int) -> None:
        if self.wants_record(step):
            self.diag.before_step()

    def post_optim_step(self, step: int) -> None:
        if self.wants_record(step):
            self.diag.after_step()

    def on_record(self, step: int, record: dict, diverged: bool) -> None:
        if self.wants_record(step):
            with self.trainer.loop.meter.spending("diag_s"):
                record.update(self.diag.collect())


class Validate(Callback):
    """The validation loss at :class:`~normbench.train.loop_parts.Evaluation`'s steps (the first, every
    ``trainer.eval_every`` and the last), timed as ``eval_s``; ``val_loss`` in the record unless a stop signal
    cut it short (then the resume does it: :meth:`finish_missing`)."""

    def __init__(self, evals: Evaluation):
        self.evals = evals

    def wants_record(self, step: int) -> bool:
        return self.evals.due(step)

    def on_record(self, step: int, record: dict, diverged: bool) -> None:
        if not self.wants_record(step) or diverged:
            return
        with self.trainer.loop.meter.spending("eval_s"):
            val = self.evaluate()
        if self.evals.record(val):
            record["val_loss"] = self.evals.last

    def finish_missing(self) -> None:
        """The evaluation a signal cut short at the checkpoint's step, done on resume: its val loss goes into that
        step's record, as in an uninterrupted run (evaluation draws no random numbers)."""
        if self.evals.missing and self.evals.record(self.evaluate()):
            self.trainer.recorder.amend_val(self.evals.last)

    @torch.no_grad()
    def evaluate(self) -> float | None:
        """Mean validation loss over the run's fixed windows (each batch: :meth:`Trainer.eval_loss`, an extension
        point); None when a stop signal cut it short (one process: under torchrun every rank must run the same
        batches, so there only the grace deadline stops it)."""
        trainer = self.trainer
        val_batches = trainer.loop.built.val_batches
        trainer.model.eval()
        total = torch.zeros((), device=trainer.loop.built.device)
        for batch in val_batches:
            if trainer.stop_signal is not None and trainer.world == 1:
                trainer.model.train()
                return None
            total += trainer.eval_loss(batch)
        trainer.model.train()
        return (total / len(val_batches)).item()
