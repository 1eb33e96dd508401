"""The report's downstream section: one table per lm-eval task the runs were scored on (``normbench eval``).

A row per group, a column per metric: the mean over seeds with its 95% t-interval, the seed as the unit as
everywhere in the report (analysis/stats.py): runs of a group that share a seed are averaged first
(:func:`seed_means`), then the interval is the one-sample t-interval over those per-seed values (n_seeds − 1
degrees of freedom; none from one seed). The harness's own stderr (over the task's documents, one run) is
not the interval: it says how well one checkpoint was measured, not how a setting varies across seeds.
A task scored with another config (its ``config_hash``), checkpoint step or ``--limit`` in some runs than in
others is said under its table; such scores compare less than they seem.
"""

from __future__ import annotations

import statistics

from normbench.analysis import numbers
from normbench.analysis.loading import Group, Run
from normbench.analysis.stats import one_sample_interval, seed_means
from normbench.errors import ConfigError
from normbench.run.eval_file import downstream_value, higher_is_better, split_metric

DASH = "—"


def tasks_of(runs: list[Run]) -> dict[str, list[str]]:
    """{task: [metric, ...]} over the runs' eval.json files, in the order first seen."""
    out: dict[str, list[str]] = {}
    for r in runs:
        for task, rec in ((r.downstream or {}).get("tasks") or {}).items():
            metrics = out.setdefault(task, [])
            metrics += [m for m in (rec or {}).get("metrics") or {} if m not in metrics]
    return out


def check_metric(metric: str, runs: list[Run]) -> None:
    """A downstream ``--metric`` must be in some run's eval.json: one line naming the ones there are."""
    split = split_metric(metric)
    if split is None or any(downstream_value(r.downstream, *split) is not None for r in runs):
        return
    there = [f"{t}/{m}" for t, ms in tasks_of(runs).items() for m in ms]
    have = f"the runs have: {', '.join(there)}" if there else "no run has an eval.json"
    raise ConfigError(f"--metric {metric}: no run has it ({have}; score them with python -m normbench eval)")


def per_seed(runs: list[Run], task: str, metric: str) -> list[float]:
    """The metric's value per seed over ``runs`` (a seed's runs averaged first: one unit), those that have it."""
    return list(seed_means(runs, lambda r: downstream_value(r.downstream, task, metric)).values())


def _cell(runs: list[Run], task: str, metric: str) -> str:
    """mean [95% CI over seeds] (n seeds) of the metric; the mean alone from one seed."""
    values = per_seed(runs, task, metric)
    if not values:
        return DASH
    mean = statistics.fmean(values)
    if len(values) < 2:
        return f"{mean:.4f} (1 seed)"
    low, high = one_sample_interval(values)
    return f"{level(mean, low, high)} ({len(values)} seeds)"


def level(mean: float, low: float, high: float) -> str:
    """``0.412 [0.398, 0.426]``: a mean and its interval at the half-width's precision (numbers.py), unsigned."""
    if high <= low:
        return f"{mean:.4f} [{low:.4f}, {high:.4f}]"
    d = numbers.spread_decimals((high - low) / 2)
    return f"{numbers.at(mean, d)} [{numbers.at(low, d)}, {numbers.at(high, d)}]"


def task_table(groups: list[Group], task: str, metrics: list[str]) -> tuple[list[str], list[list[str]]]:
    runs = [r for g in groups for r in g.runs]
    arrows = {m: "↑" if higher_is_better((r.downstream for r in runs), task, m) else "↓" for m in metrics}
    header = ["group", *(f"{m} {arrows[m]} [95% CI over seeds]" for m in metrics), "documents", "step"]
    rows = []
    for g in groups:
        scored = [r for r in g.runs if ((r.downstream or {}).get("tasks") or {}).get(task)]
        n = sorted({str(r.downstream["tasks"][task].get("n")) for r in scored})
        steps = sorted({str(r.downstream.get("checkpoint_step")) for r in scored})
        rows.append(
            [g.label, *(_cell(scored, task, m) for m in metrics), ", ".join(n) or DASH, ", ".join(steps) or DASH]
        )
    return header, rows


def _mixed(runs: list[Run], task: str) -> str | None:
    """Where the runs scored ``task`` differently (config, harness version, limit), in words."""
    recs = [(r, r.downstream["tasks"][task]) for r in runs if ((r.downstream or {}).get("tasks") or {}).get(task)]
    notes = []
    for what, get in (
        ("task configs", lambda r, rec: rec.get("config_hash")),
        ("harness versions", lambda r, rec: r.downstream.get("harness_version")),
        ("--limit values", lambda r, rec: rec.get("limit")),
    ):
        if len({str(get(r, rec)) for r, rec in recs}) > 1:
            notes.append(what)
    return f"Scored with different {', '.join(notes)} across the runs: compare with care." if notes else None


def downstream_section(groups: list[Group]) -> list[tuple]:
    """The section's blocks; none when no run has an eval.json."""
    runs = [r for g in groups for r in g.runs]
    tasks = tasks_of(runs)
    if not tasks:
        return []
    blocks: list[tuple] = [
        ("h", 2, "Downstream"),
        (
            "p",
            "lm-evaluation-harness scores (`normbench eval`, each run's eval.json), one table per task: the "
            "mean over seeds with the **seed as the unit** (runs sharing a seed averaged first), and the 95% "
            "t-interval over seeds (none from one seed); ↑ higher is better, ↓ lower. `--metric TASK/METRIC` "
            "puts one in the verdict box.",
        ),
    ]
    for task, metrics in tasks.items():
        blocks += [("h", 3, task), ("table", *task_table(groups, task, metrics))]
        if note := _mixed(runs, task):
            blocks.append(("p", note))
    return blocks
