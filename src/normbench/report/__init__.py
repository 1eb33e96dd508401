"""Tables and figures for runs and sweeps: ``python -m normbench report DIR [DIR ...]``.

:func:`make_report` finds every run below the given directories (merged into one report),
keeps those matching ``--filter``, groups them (``--group-by``, by default the Hydra overrides
that differ between runs; seeds are averaged over) and writes ``report.md``, ``report.html``
(the same content with the figures embedded, one file to send) and the figures (PNG, plus PDF or
SVG with ``--format``). The report opens with the answer: a verdict box (each varied factor against
a baseline value, with the interval ``reproduce`` uses) beside a setup box (what the runs held
fixed). Diverged, stuck, failed and still-running runs are always shown, never dropped.

The pieces, for code that builds on them (e.g. a ``reproduce`` command); the runs read back and their
statistics live in :mod:`normbench.analysis` (re-exported here):

- :mod:`normbench.analysis.loading`: :func:`load_runs` / :func:`find_runs` -> :class:`Run` (``status``,
  ``outcome``, ``val_losses``), :func:`filter_runs`, :func:`group_runs` -> :class:`Group`,
  :func:`setting` (a run's value for a key), :func:`read_metrics`;
- :mod:`normbench.analysis.stats`: :func:`time_to_target`, :func:`default_targets`, :func:`group_metric`,
  :func:`welch_interval` and :func:`compare` (difference from a baseline group, 95% CI), and the
  interval rule shared with ``reproduce`` (``interval``, ``seed_means``, ``seed_pairs``);
- :mod:`.verdicts` and :mod:`.setup`: the two boxes at the top (:mod:`normbench.analysis.contrasts`: the
  verdict box's contrasts, the seed as the unit, and Holm's adjustment; :mod:`normbench.analysis.numbers`:
  rounding to the spread);
- :mod:`.tables` and :mod:`.figures` (a package: its common parts, :mod:`.figures.curves`,
  :mod:`.figures.layers`) format them;
  :mod:`.page` renders Markdown and HTML; :mod:`.table_files` writes the tables as CSV and JSON beside
  report.md; :mod:`.build` writes the report.

Outcomes and per-layer statistics are defined in :mod:`normbench.diag.outcomes`.
"""

from normbench.analysis.loading import (
    Group,
    Run,
    filter_runs,
    find_runs,
    group_runs,
    load_run,
    load_runs,
    read_metrics,
    setting,
)
from normbench.analysis.stats import (
    Difference,
    Reached,
    compare,
    default_targets,
    group_metric,
    time_to_target,
    welch_interval,
)
from normbench.report.build import build_report, make_report
from normbench.report.cli import main

__all__ = [
    "Difference",
    "Group",
    "Reached",
    "Run",
    "build_report",
    "compare",
    "default_targets",
    "filter_runs",
    "find_runs",
    "group_metric",
    "group_runs",
    "load_run",
    "load_runs",
    "main",
    "make_report",
    "read_metrics",
    "setting",
    "time_to_target",
    "welch_interval",
]
