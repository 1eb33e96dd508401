"""Hydra callback: a sweep's progress on the console, and its leaderboard when it ends.

:class:`SweepProgress` (registered under ``hydra.callbacks`` in conf/config.yaml) prints a line as each
job starts (``sweep job 4/12``, the time so far and the sweep's ETA: the mean job time so far times the
jobs left) and, when the sweep ends, its leaderboard: the best groups and the report's verdict box in a
few lines (normbench.report.verdicts). The job count comes from the sweep's overrides and
``hydra.sweeper.params`` (Optuna: ``n_trials``); a launcher that runs jobs in other processes (joblib,
SLURM) gets the start lines without the ETA there. It lives with the CLI because it reads the report.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Glob
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from normbench.config.files import options


def planned_jobs(config: DictConfig) -> int | None:
    """How many jobs the sweep launches: the product of the sizes of its swept overrides and of
    ``hydra.sweeper.params`` (Optuna: ``n_trials``); None when a range or interval makes it unknown."""

    sweeper = config.hydra.sweeper
    if "optuna" in str(sweeper.get("_target_", "")).lower():
        return int(sweeper.n_trials) if sweeper.get("n_trials") else None
    task = list(config.hydra.overrides.task)
    given = {o.split("=", 1)[0].lstrip("+~") for o in task}
    params = sweeper.get("params") or {}
    task += [f"{k}={v}" for k, v in params.items() if k not in given]
    total = 1
    for o in OverridesParser.create().parse_overrides(task):
        if not o.is_sweep_override():
            continue
        if not o.is_discrete_sweep():
            return None
        value = o.value()
        total *= (
            len(value.filter(options(o.get_key_element())))
            if isinstance(value, Glob)
            else len(list(o.sweep_string_iterator()))
        )
    return total


class SweepProgress(Callback):
    def __init__(self) -> None:
        self.total: int | None = None
        self.start: float | None = None
        self.job_start = 0.0
        self.durations: list[float] = []

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.start = time.monotonic()
        try:
            self.total = planned_jobs(config)
        except Exception:  # a count is a nicety; never stop a sweep over it
            self.total = None

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:

        from normbench.runtime.throughput import fmt_time  # deferred (start-up time): torch

        hc = HydraConfig.get()
        if hc.mode != RunMode.MULTIRUN:
            return
        self.job_start = time.monotonic()
        k = int(hc.job.num) + 1
        of = f"/{self.total}" if self.total else ""
        when = ""
        if self.durations and self.start is not None:
            left = (self.total - k + 1) if self.total else None
            eta = f"; sweep ETA {fmt_time(left * sum(self.durations) / len(self.durations))}" if left else ""
            when = f" ({len(self.durations)} done in {fmt_time(time.monotonic() - self.start)}{eta})"
        print(f"sweep job {k}{of}{when}: {' '.join(hc.overrides.task)}", flush=True)

    def on_job_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self.job_start:
            self.durations.append(time.monotonic() - self.job_start)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from normbench.runtime.throughput import fmt_time  # deferred (start-up time): torch

        where = Path(str(config.hydra.sweep.dir))
        took = f" in {fmt_time(time.monotonic() - self.start)}" if self.start is not None else ""
        try:
            lines = leaderboard_lines(where)
        except Exception as exc:  # the runs are written; a summary that fails must not hide that
            lines = [f"(no summary: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"]
        # a launcher that runs the jobs in worker processes (joblib) calls on_job_* there, not here: the planned count
        jobs = len(self.durations) or self.total or "?"
        print(f"sweep finished: {jobs} jobs{took}", flush=True)
        for line in lines:
            print(f"  {line}", flush=True)
        sys.stdout.flush()


def leaderboard_lines(sweep_dir: Path) -> list[str]:
    """The sweep's best groups by best val loss and the verdict box, a few lines for the console."""
    from normbench.analysis.loading import group_runs, load_runs  # deferred (start-up time): numpy, yaml
    from normbench.report.verdicts import leaderboard, verdict_lines  # deferred (start-up time): torch, numpy, yaml

    runs = load_runs([sweep_dir]) if sweep_dir.is_dir() else []
    if not runs:
        return []
    groups = group_runs(runs)
    top = leaderboard(groups, n=3)
    lines = [f"best val loss, top {len(top)} of {len(groups)} groups, best first (mean ± std over seeds):", *top]
    verdict = verdict_lines(groups)
    head = "verdict (each factor against its default; 95% intervals over seeds):"
    return lines + ([head, *verdict] if verdict else [])
