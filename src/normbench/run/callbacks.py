"""Hydra callback: a refused single run leaves its run directory's ``.hydra/`` as it was.

Hydra writes ``.hydra/config.yaml``, ``hydra.yaml`` and ``overrides.yaml`` into the run directory
before the job starts (``hydra.core.utils.run_job``). When normbench then refuses the run (a resume
with another arch, a checkpoint that does not fit: a :class:`~normbench.errors.ConfigError`), those
files would describe a run that never happened, and the next resume would compare against them.
:class:`KeepHydraFiles` (registered under ``hydra.callbacks`` in conf/config.yaml) reads the files
at ``on_run_start``, before Hydra rewrites them, and writes them back at ``on_job_end`` when the job
returned :class:`Refused`. Sweeps are left alone: each job of a sweep has its own directory.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hydra.core.utils import JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from normbench.run.metrics import write_atomic
from normbench.run.rundir import RunDir


class Refused(str):
    """What a single run's task returns when normbench refused it (the one-line reason)."""


class KeepHydraFiles(Callback):
    def __init__(self) -> None:
        self.saved: dict[Path, bytes] = {}

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.saved = {}
        if int(os.environ.get("RANK", 0)) != 0:  # torchrun: rank 0 owns the run directory's files
            return
        try:
            hydra_dir = RunDir(str(config.hydra.run.dir)).hydra_dir
        except Exception:  # an interpolation only the job can resolve: a new directory anyway
            return
        if hydra_dir.is_dir():
            self.saved = {p: p.read_bytes() for p in hydra_dir.iterdir() if p.is_file()}

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        if job_return.status != JobStatus.COMPLETED or not isinstance(job_return.return_value, Refused):
            return
        for path, data in self.saved.items():
            write_atomic(path, lambda f, data=data: f.write(data), binary=True)
