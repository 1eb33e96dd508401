"""The report's tables as data beside ``report.md``: ``report_runs.csv``/``.json`` (one row per run) and
``report_groups.csv``/``.json`` (one row per group, the main table's), for a spreadsheet, pandas or a
dashboard, which the Markdown's rounded ``mean ± std`` cells do not feed.

The rows are the ones the report's tables show, in their order (runs as in "All runs", groups by mean
best val loss), from the same helpers (:mod:`.tables`, :mod:`normbench.analysis.stats`), with each number
as a number: unrounded, a mean and its sample std in two columns (std ``null`` below two values), and
each grouping key's value in a column of its own. ``null`` (JSON) and an empty cell (CSV) mean no value
(no evaluation yet, the target not reached, ...). JSON is a list of objects, one per row, keys in the CSV's
column order; the CSV writes ``true``/``false`` as JSON does.
"""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

from normbench.analysis.loading import Group, Run, setting
from normbench.analysis.stats import (
    loss_pool,
    outcome_counts,
    status_counts,
    target_for,
    time_to_target,
)
from normbench.diag.outcomes import finite
from normbench.report import downstream, tables
from normbench.run.eval_file import downstream_value

RUNS, GROUPS = "report_runs", "report_groups"  # file stems: .csv and .json of each
FILES = tuple(f"{stem}.{ext}" for stem in (RUNS, GROUPS) for ext in ("csv", "json"))


def _number(x) -> float | int | None:
    return x if finite(x) else None


def _mean(xs: list[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def _std(xs: list[float]) -> float | None:
    return statistics.stdev(xs) if len(xs) > 1 else None


def _seed(run: Run) -> int | str | None:
    seed = setting(run, "seed")
    try:
        return int(seed) if seed is not None else None
    except ValueError:
        return seed


def _settings(groups: list[Group], fixed: list[str]) -> list[str]:
    """The grouping keys, in the groups' order, without those a fixed column already holds (``seed``)."""
    keys = dict.fromkeys(k for g in groups for k in g.settings)
    return [k for k in keys if k not in fixed]


RUN_COLUMNS = [
    "run",
    "group",
    "seed",
    "status",
    "outcome",
    "step",
    "tokens",
    "final_val_loss",
    "best_val_loss",
    "target",
    "steps_to_target",
    "tokens_to_target",
    "seconds_to_target",
    "tokens_per_s",
    "wall_s",
    "n_params",
    "spikes",
    "reason",
]


def _downstream_metrics(groups: list[Group]) -> list[tuple[str, str]]:
    """(task, metric) of every score in the runs' eval.json files (``normbench eval``), in the order first seen."""
    return [(t, m) for t, ms in downstream.tasks_of([r for g in groups for r in g.runs]).items() for m in ms]


def run_rows(groups: list[Group], target=None, defaults=None) -> list[dict]:
    """One record per run, as the "All runs" table orders them, its grouping keys after ``group`` and its
    downstream scores (``TASK/METRIC``, from eval.json) before ``reason``."""
    keys = _settings(groups, RUN_COLUMNS)
    scores = _downstream_metrics(groups)
    rows = []
    for g in groups:
        for r in g.runs:
            s = r.summary or {}
            t = target_for(r, target, defaults or {})
            hit = time_to_target(r, t)
            final, best = r.val_losses
            tokens = (
                s.get("tokens")
                if finite(s.get("tokens"))
                else max((rec["tokens"] for rec in r.records if finite(rec.get("tokens"))), default=None)
            )
            row = {
                "run": r.name,
                "group": g.label,
                **{k: g.settings.get(k) for k in keys},
                "seed": _seed(r),
                "status": r.status,
                "outcome": r.outcome,
                "step": r.last_step,
                "tokens": tokens,
                "final_val_loss": final,
                "best_val_loss": best,
                "target": t,
                "steps_to_target": hit.steps if hit else None,
                "tokens_to_target": hit.tokens if hit else None,
                "seconds_to_target": hit.seconds if hit else None,
                "tokens_per_s": _number(s.get("tokens_per_s")),
                "wall_s": _number(s.get("wall_s")),
                "n_params": _number(s.get("n_params")),
                "spikes": int(s["spikes"]) if finite(s.get("spikes")) else None,
            }
            row |= {f"{t}/{m}": downstream_value(r.downstream, t, m) for t, m in scores}
            row["reason"] = tables.run_reason(r)
            rows.append(row)
    return rows


GROUP_COLUMNS = [
    "group",
    "runs",
    "outcomes",
    "status",
    "averaged",
    "partial",
    "final_val_loss_mean",
    "final_val_loss_std",
    "best_val_loss_mean",
    "best_val_loss_std",
    "target",
    "reached",
    "steps_to_target_mean",
    "steps_to_target_std",
    "tokens_to_target_mean",
    "tokens_to_target_std",
    "seconds_to_target_mean",
    "seconds_to_target_std",
    "tokens_per_s_mean",
    "loaded",
    "spikes",
    "notes",
]


def group_rows(groups: list[Group], target=None, defaults=None) -> list[dict]:
    """One record per group, the main table's rows and the time-to-target table's numbers: losses over the
    runs the report averages (``averaged`` of them; ``partial``: none completed, so the runs so far),
    time to target over the ``reached`` runs that got there (``target``: null where the group's runs have
    different targets, one per corpus), tokens/s with ``loaded`` where the report flags it."""
    keys = _settings(groups, GROUP_COLUMNS)
    scores = _downstream_metrics(groups)
    loaded = tables.sweep_loaded(groups)  # the machine's load, the same for every group (tables.sweep_loaded)
    rows = []
    for g in tables.sort_groups(groups):
        pool, partial = loss_pool(g)
        finals = [f for r in pool if (f := r.val_losses[0]) is not None]
        bests = [b for r in pool if (b := r.val_losses[1]) is not None]
        hits = [h for r in g.runs if (h := time_to_target(r, target_for(r, target, defaults or {}))) is not None]
        targets = {t for r in g.runs if (t := target_for(r, target, defaults or {})) is not None}
        tps = [t for r in pool if finite(t := (r.summary or {}).get("tokens_per_s"))]
        spikes = [int(c) for r in g.runs if finite(c := (r.summary or {}).get("spikes"))]
        row = {
            "group": g.label,
            **{k: g.settings.get(k) for k in keys},
            "runs": len(g.runs),
            "outcomes": outcome_counts(g.runs),
            "status": status_counts(g.runs),
            "averaged": len(pool),
            "partial": partial,
            "final_val_loss_mean": _mean(finals),
            "final_val_loss_std": _std(finals),
            "best_val_loss_mean": _mean(bests),
            "best_val_loss_std": _std(bests),
            "target": targets.pop() if len(targets) == 1 else None,
            "reached": len(hits),
        }
        for what in ("steps", "tokens", "seconds"):
            xs = [getattr(h, what) for h in hits]
            row |= {f"{what}_to_target_mean": _mean(xs), f"{what}_to_target_std": _std(xs)}
        row |= {
            "tokens_per_s_mean": _mean(tps),
            "loaded": loaded,
            "spikes": sum(spikes) if spikes else None,
        }
        for t, m in scores:  # over seeds, the seed as the unit (a seed's runs averaged first), as the report's table
            per_seed = downstream.per_seed(g.runs, t, m)
            row |= {f"{t}/{m}_mean": _mean(per_seed), f"{t}/{m}_std": _std(per_seed), f"{t}/{m}_seeds": len(per_seed)}
        row["notes"] = "; ".join(tables.group_notes(g))
        rows.append(row)
    return rows


def _cell(value) -> object:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value


def _write(out_dir: Path, stem: str, rows: list[dict]) -> list[Path]:
    columns = list(dict.fromkeys(k for row in rows for k in row))
    csv_path, json_path = out_dir / f"{stem}.csv", out_dir / f"{stem}.json"
    with csv_path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        writer.writerows([_cell(row.get(k)) for k in columns] for row in rows)
    json_path.write_text(json.dumps(rows, indent=1, ensure_ascii=False, allow_nan=False) + "\n", encoding="utf-8")
    return [csv_path, json_path]


def write_tables(out_dir: Path, groups: list[Group], target=None, defaults=None) -> list[Path]:
    """Write the four files into ``out_dir``; return their paths."""
    return _write(out_dir, RUNS, run_rows(groups, target, defaults)) + _write(
        out_dir, GROUPS, group_rows(groups, target, defaults)
    )


NOTE = (  # the report's sentence above its runs table
    "The tables as data, every number unrounded (a mean and its std in two columns), beside this "
    "report: `report_runs.csv` and `report_runs.json` (this table, with each run's settings, final "
    "val loss, tokens, tokens/s and downstream scores), `report_groups.csv` and `report_groups.json` (the "
    "groups' table above, with time to target and the downstream scores over seeds)."
)
