"""The jobs of a sweep that never started, and the command that finishes the sweep.

A sweep killed (or stopped by a signal) before its last jobs leaves no directory for them, so no run
says they are missing; the sweep's ``multirun.yaml`` (Hydra writes it into the sweep directory before
the first job) holds the whole sweep. Its jobs are expanded here as Hydra's basic sweeper expands them
(``BasicSweeper.split_arguments``: the sweeper's ``params`` and the command line's overrides) and
matched with the runs found below the sweep directory by their overrides (``.hydra/overrides.yaml``),
bookkeeping keys (``trainer.resume``, ``logger``) left out: a resumed sweep adds ``trainer.resume=true``.
Another sweeper (Optuna) picks its jobs as it goes: none is missing in advance.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from normbench.analysis.loading import Run, load_yaml, norm_value
from normbench.run.commands import TRAIN, resume_command
from normbench.run.resume import BOOKKEEPING_KEYS


@dataclass
class Unstarted:
    sweep: Path  # the sweep directory (holding multirun.yaml)
    total: int  # the jobs of the whole sweep
    jobs: list[str]  # each job that never started, by the values the sweep varies ("seed=2 arch=post_ln")
    command: str  # the command that finishes the sweep (and resumes its stopped and interrupted jobs)

    def line(self) -> str:
        return (
            f"sweep {self.sweep}: {len(self.jobs)} of its {self.total} jobs never started "
            f"({', '.join(self.jobs)}); finish the sweep with: {self.command}"
        )


def sweep_jobs(multirun) -> list[list[str]] | None:
    """Every job's overrides, in the sweep's order; None for another sweeper than Hydra's basic one, or
    overrides it cannot expand without the config (a ``glob`` of config options)."""
    hydra = multirun.get("hydra") if isinstance(multirun, dict) else None
    sweeper = (hydra or {}).get("sweeper") or {}
    if not str(sweeper.get("_target_", "")).endswith(".BasicSweeper"):
        return None
    params = [f"{k}={v}" for k, v in (sweeper.get("params") or {}).items()]
    task = [str(o) for o in ((hydra.get("overrides") or {}).get("task") or [])]
    try:
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper  # its failure is handled here
        from hydra.core.override_parser.overrides_parser import OverridesParser  # its failure is handled here

        parsed = OverridesParser.create().parse_overrides(params + task)
        return [list(job) for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]
    except Exception:  # whatever Hydra cannot expand here, the report does not guess at
        return None


def _setting(override: str) -> tuple[str, str] | None:
    key, sep, value = override.partition("=")
    key = key.lstrip("+~")
    if not sep or key in BOOKKEEPING_KEYS or key.startswith("hydra"):
        return None
    return key, norm_value(value)


def _key(overrides: list[str]) -> tuple:
    return tuple(sorted(s for o in overrides if (s := _setting(o)) is not None))


def unstarted(sweep_dir: Path, runs: list[Run]) -> Unstarted | None:
    """The jobs of the sweep in ``sweep_dir`` that no run below it started; None when every one did."""
    multirun = load_yaml(sweep_dir / "multirun.yaml")
    jobs = sweep_jobs(multirun)
    if not jobs:
        return None
    root = sweep_dir.resolve()
    started = Counter(_key(r.overrides) for r in runs if root in r.path.resolve().parents)
    missing = []
    for job in jobs:
        if started[_key(job)] > 0:
            started[_key(job)] -= 1
        else:
            missing.append(job)
    if not missing:
        return None
    return Unstarted(sweep_dir, len(jobs), _labels(jobs, missing), _finish_command(multirun, root))


def _labels(jobs: list[list[str]], missing: list[list[str]]) -> list[str]:
    """Each missing job by the overrides whose values differ between the sweep's jobs."""
    keyed = [dict(_key(job)) for job in jobs]
    varied = {k for d in keyed for k in d if len({e.get(k) for e in keyed}) > 1}
    shown = lambda job: [o for o in job if (s := _setting(o)) is not None and s[0] in varied]
    return [" ".join(shown(job) or job) for job in missing]


def _finish_command(multirun: dict, sweep_dir: Path) -> str:
    """The sweep's own command line (multirun.yaml: hydra.overrides) into its directory, with trainer.resume=true."""
    overrides = multirun["hydra"].get("overrides") or {}
    own = ("hydra.mode=", "hydra.sweep.dir=")  # -m, and the directory the command names itself
    hydra = [o for o in map(str, overrides.get("hydra") or []) if not o.startswith(own)]
    args = [*map(str, overrides.get("task") or []), *hydra]
    return resume_command(args, sweep_dir=sweep_dir, prefix=(*TRAIN, "-m"))


def unstarted_jobs(dirs: list[Path], runs: list[Run]) -> list[Unstarted]:
    """For each sweep directory at or below ``dirs`` (each once), its jobs that never started."""
    sweeps = dict.fromkeys(p.parent.resolve() for d in dirs for p in sorted(Path(d).rglob("multirun.yaml")))
    return [u for s in sweeps if (u := unstarted(s, runs)) is not None]
