"""The commands normbench prints to go on with a run or a sweep: an interrupted run's own (built by
``normbench.cli.resume_command`` from its argv) and the report's, for a run killed without a word or a
sweep with jobs not started (built from what the run's or the sweep's directory holds)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

TRAIN = ("python", "-m", "normbench", "train")
_SAFE_VALUE = re.compile(r"[A-Za-z0-9_./:+@%-]*")
_OWN = ("trainer.resume=", "hydra.run.dir=", "hydra.sweep.dir=")  # the command sets these itself


def hydra_value(value: str) -> str:
    """``value`` as Hydra's grammar reads it back (quoted when it holds special characters)."""
    if _SAFE_VALUE.fullmatch(value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def resume_command(
    args: list[str],
    run_dir: Path | None = None,
    sweep_dir: Path | None = None,
    prefix: tuple[str, ...] | list[str] = TRAIN,
) -> str:
    """``PREFIX ARGS hydra.run.dir=RUN_DIR trainer.resume=true`` (with ``sweep_dir``: ``hydra.sweep.dir=``),
    ``ARGS`` without a run or sweep directory and resume flag of their own, each quoted for the shell."""
    kept = [a for a in args if not a.startswith(_OWN)]
    key, path = ("hydra.sweep.dir", sweep_dir) if sweep_dir is not None else ("hydra.run.dir", run_dir)
    return " ".join(shlex.quote(a) for a in [*prefix, *kept, f"{key}={hydra_value(str(path))}", "trainer.resume=true"])
