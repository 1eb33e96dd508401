"""Hydra callback: two sweeps started at the same time never share a sweep directory.

The default ``hydra.sweep.dir`` is ``outputs/multirun/<date>/<time with microseconds>``
(``conf/config.yaml``). Two sweeps that resolve ``${now:...}`` in the same microsecond
(many submissions from one script, several hosts on a shared filesystem) would get the
same directory and write into each other's job dirs. :class:`UniqueSweepDir` claims
the directory with an atomic ``mkdir`` before any job starts; if another sweep holds
it already, this sweep takes ``<dir>-1`` (``-2``, ...) instead. It does not depend on
the resolver: the claim is the filesystem's. An explicit ``hydra.sweep.dir=...``
(reusing a sweep dir on purpose, e.g. to resume its jobs) is left alone.

It also prints the sweep directory when the sweep starts and when it ends (with the
command that reports on it), so a newcomer never has to guess where the results went.

:class:`SweepProgress` prints a line as each job starts (``sweep job 4/12``, the time so far and the
sweep's ETA: the mean job time so far times the jobs left) and, when the sweep ends, its leaderboard:
the best groups and the report's verdict box in a few lines (normbench.report.verdicts). The job
count comes from the sweep's overrides and ``hydra.sweeper.params`` (Optuna: ``n_trials``); a launcher
that runs jobs in other processes (joblib, SLURM) gets the start lines without the ETA there.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write


def _quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def claim(path: Path, attempts: int = 1000) -> Path:
    """Create ``path`` (or the first free ``path-N``) atomically; return the one created."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for i in range(attempts):
        candidate = path if i == 0 else path.with_name(f"{path.name}-{i}")
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
    raise FileExistsError(f"no free sweep directory next to {path}")


class UniqueSweepDir(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        sweep = config.hydra.sweep
        if "${now:" not in str(OmegaConf.to_container(sweep, resolve=False).get("dir")):
            print(f"sweep directory: {Path(str(sweep.dir)).resolve()}", flush=True)
            return  # chosen by the user
        wanted = Path(str(sweep.dir))
        got = claim(wanted)
        print(f"sweep directory: {got.resolve()}", flush=True)
        if got == wanted:
            return
        # the launcher re-composes each job from hydra.overrides.hydra: the new dir goes there too
        with read_write(config.hydra), open_dict(config.hydra):
            sweep.dir = str(got)
            config.hydra.overrides.hydra.append(f"hydra.sweep.dir={_quote(str(got))}")

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        where = Path(str(config.hydra.sweep.dir)).resolve()
        print(f"sweep directory: {where}  (report: python -m normbench report {where})", flush=True)


def planned_jobs(config: DictConfig) -> int | None:
    """How many jobs the sweep launches: the product of the sizes of its swept overrides and of
    ``hydra.sweeper.params`` (Optuna: ``n_trials``); None when a range or interval makes it unknown."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Glob

    from normbench.config.files import options

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
        except Exception:  # noqa: BLE001 - a count is a nicety; never stop a sweep over it
            self.total = None

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        from normbench.train.throughput import fmt_time

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
        from normbench.train.throughput import fmt_time

        where = Path(str(config.hydra.sweep.dir))
        took = f" in {fmt_time(time.monotonic() - self.start)}" if self.start is not None else ""
        try:
            lines = leaderboard_lines(where)
        except Exception as exc:  # noqa: BLE001 - the runs are written; a summary that fails must not hide that
            lines = [f"(no summary: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"]
        print(f"sweep finished: {len(self.durations) or '?'} jobs{took}", flush=True)
        for line in lines:
            print(f"  {line}", flush=True)
        sys.stdout.flush()


def leaderboard_lines(sweep_dir: Path) -> list[str]:
    """The sweep's best groups by best val loss and the verdict box, a few lines for the console."""
    from normbench.report.loading import group_runs, load_runs
    from normbench.report.verdicts import leaderboard, verdict_lines

    runs = load_runs([sweep_dir]) if sweep_dir.is_dir() else []
    if not runs:
        return []
    groups = group_runs(runs)
    lines = ["best val loss, best groups first (mean ± std over seeds):", *leaderboard(groups, n=3)]
    verdict = verdict_lines(groups)
    return lines + (["verdict (each factor against its default; 95% interval):", *verdict] if verdict else [])
