"""Downstream tasks while training (``eval.tasks=[piqa] eval.every=500``; off by default): a trainer callback.

OLMo-core runs its downstream evaluators as trainer callbacks and llm.c scores HellaSwag during training; here
:class:`DownstreamEval` (a :class:`~normbench.train.callbacks.Callback`) is handed to the trainer by ``normbench
train`` (cli.run_job) when ``eval.tasks`` names tasks, and at each validation step that is a multiple of
``eval.every`` (and the last step; ``eval.every=0``: the last step only) it scores the model as it is with
:class:`~normbench.downstream.lm.NormbenchLM`. Each metric goes into that step's metrics.jsonl record (and W&B)
as ``downstream/TASK/METRIC``. The evaluation reads the model and leaves everything else as it found it: the
model back in training mode and the random number generators restored (the harness seeds Python's, NumPy's and
torch's), so a run trains the same with and without it and resumes exactly. The task names are checked when the
run starts, in one line. One process only: under torchrun, score the checkpoints afterwards with ``normbench eval``.
"""

from __future__ import annotations

import contextlib
import logging
import random

import numpy as np
import torch

from normbench.downstream import require_harness
from normbench.downstream.harness import task_manager
from normbench.errors import ConfigError
from normbench.run.eval_file import task_records
from normbench.runtime import distributed as dist_utils
from normbench.train.callbacks import Callback

PREFIX = "downstream"


@contextlib.contextmanager
def kept_rng():
    """Python's, NumPy's, torch's (and CUDA's) random states as they were before the block."""
    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


class DownstreamEval(Callback):
    """At its steps, ``downstream/TASK/METRIC`` into the step's record, timed as evaluation (``eval_s``)."""

    def __init__(self, cfg):
        require_harness()
        if dist_utils.world_size() > 1:
            raise ConfigError("eval.tasks runs in one process; under torchrun score checkpoints with normbench eval")
        e = cfg.eval
        self.tasks, self.every, self.batch_size = list(e.tasks), int(e.every), int(e.batch_size)
        self.limit = None if e.limit is None else (int(e.limit) if e.limit >= 1 else float(e.limit))
        self.manager = task_manager(self.tasks, e.include_path)

    def wants_record(self, step: int) -> bool:
        return step == self.trainer.max_steps or (self.every > 0 and step % self.every == 0)

    def on_record(self, step: int, record: dict, diverged: bool) -> None:
        if self.wants_record(step) and not diverged:
            with self.trainer.loop.meter.spending("eval_s"):
                record.update(self.scores(self.trainer))

    def scores(self, trainer) -> dict:
        """{``downstream/TASK/METRIC``: value} of the model as it is now."""
        import lm_eval  # the optional `eval` extra, checked at start

        from normbench.downstream.lm import NormbenchLM  # optional dependency (the eval extra)

        c = trainer.loop.built
        lm = NormbenchLM(trainer.raw_model, c.data.tokenizer, c.autocast, self.batch_size)
        logging.getLogger("lm_eval").setLevel(logging.WARNING)
        try:
            with kept_rng():
                out = lm_eval.simple_evaluate(
                    model=lm, tasks=self.tasks, task_manager=self.manager, limit=self.limit, log_samples=False
                )
        finally:
            trainer.raw_model.train()
        records = task_records(out, {})
        return {
            f"{PREFIX}/{task}/{metric}": v["value"]
            for task, rec in records.items()
            for metric, v in rec["metrics"].items()
        }
