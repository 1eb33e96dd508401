"""The report: collect the runs, check every input, write report.md, report.html, the tables as data and the
figures (the command line: :mod:`.cli`; the sections: :mod:`.sections`, :mod:`.gallery`)."""

from __future__ import annotations

import difflib
import os
import sys
from pathlib import Path

from normbench.analysis.loading import (
    check_key,
    filter_runs,
    group_runs,
    load_runs,
    parse_assignment,
    unreadable_summaries,
)
from normbench.analysis.stats import default_targets
from normbench.analysis.unstarted import unstarted_jobs
from normbench.errors import ConfigError
from normbench.report import downstream, figures, gallery, sections, table_files, tables
from normbench.report.figures import curves as curve_figures
from normbench.report.page import to_html, to_markdown


def build_report(
    dirs,
    target=None,
    steps=None,
    out=None,
    group_by=None,
    filters=None,
    baseline=None,
    color_by=None,
    style_by=None,
    figures_too=True,
    *,
    metric: str = "best val loss",
    formats: tuple[str, ...] = figures.FORMATS,
    dpi: int = figures.DPI,
    width: float = figures.WIDTH,
    title: str | None = None,
    head: list[tuple] = (),
    x: str = "step",
    runs_too: bool = False,
    only: set[str] | None = None,
) -> tuple[Path, Path, list[Path], int]:
    """Write the report; return (report.md, report.html, figure paths, number of runs). Every input is checked before
    anything is written; the sections then follow in the order a reader asks: the answer (the verdict and setup
    boxes), the runs and their outcomes, time to target, per-layer statistics, the baseline, the LR sweep, Optuna,
    every run, the figures. ``title``: the page's heading and ``<title>`` (default: the sweep's, :func:`sweep_title`);
    ``head``: blocks before the answer (the claim page of ``reproduce``: its claim, verdict and figure). ``x``: the x
    axis of the loss and LR/grad-norm curves (``step``, ``tokens``, ``time``); ``runs_too``: each run's own line in
    them; ``only``: the real paths of the runs to report, where ``dirs`` hold others too (a claim's page: its planned
    runs). The tables are written as data beside report.md too (:mod:`.table_files`)."""
    dirs = [Path(d) for d in ([dirs] if isinstance(dirs, (str, Path)) else dirs)]
    runs, groups, missing = _grouped_runs(dirs, filters, group_by, only)
    for flag, key in (("--color-by", color_by), ("--style-by", style_by)):
        if key:
            check_key(runs, key, flag)
    base = _baseline(baseline, groups)
    downstream.check_metric(metric, runs)
    check_formats(formats, dpi, width)
    curve_figures.check_x(x)
    out_dir = Path(out) if out is not None else dirs[0]
    out_dir.mkdir(parents=True, exist_ok=True)
    defaults = {} if target is not None else default_targets(runs)
    chosen = (base[0], base[1][0]) if base else None
    title = title or sweep_title(dirs, runs, groups)
    blocks = [("h", 1, title), *head, sections.answer(groups, chosen, metric, target, defaults)]
    blocks += sections.unstarted_section(missing) + sections.overview(dirs, runs, groups, filters, target, defaults)
    sweep = tables.lr_sweep(groups)
    blocks += _detail_sections(dirs, groups, baseline, base, sweep, target, defaults)
    styles = figures.Styles(groups, color_by, style_by)
    plots: list[Path] = []
    if figures_too:
        blocks += [("h", 2, "Figures"), ("p", f"Every figure: {figures.setup_caption(groups)}")]
        save = figures.Output(tuple(formats), dpi, width)
        drawn = gallery.figure_section(groups, styles, sweep, steps, out_dir, save, x, runs_too)
        blocks, plots = blocks + drawn.blocks, drawn.plots
    table_files.write_tables(out_dir, groups, target, defaults)
    md_path, html_path = out_dir / "report.md", out_dir / "report.html"
    md_path.write_text(to_markdown(blocks), encoding="utf-8")
    html_path.write_text(to_html(blocks, out_dir, title), encoding="utf-8")
    return md_path, html_path, plots, len(runs)


def _detail_sections(dirs, groups, baseline, base, sweep, target, defaults) -> list[tuple]:
    """After the overview: downstream tasks, per-layer statistics, the baseline, the LR sweep, Optuna and
    every run, each only where the runs have it."""
    blocks = downstream.downstream_section(groups) + sections.layer_section(groups)
    if base:
        blocks += sections.baseline_section(groups, baseline, base, target, defaults)
    if sweep:
        blocks += sections.lr_section(sweep)
    blocks += sections.optuna_sections(dirs)
    return blocks + [
        ("h", 2, "All runs"),
        ("p", table_files.NOTE),
        ("table", *tables.runs_table(groups, target, defaults)),
    ]


def sweep_title(dirs: list[Path], runs, groups) -> str:
    """``normbench report: arch × norm, 12 runs (14-03-27)``: what was varied, how many runs, and where."""
    varied = " × ".join(groups[0].settings) if groups and groups[0].settings else "one group"
    where = ", ".join(d.resolve().name or str(d) for d in dirs)
    return f"normbench report: {varied}, {len(runs)} runs ({where})"


def check_formats(formats, dpi, width: float = figures.WIDTH) -> None:
    bad = [f for f in formats if f not in figures.ALL_FORMATS]
    if bad or not formats:
        raise ConfigError(
            f"--format {','.join(formats)}: {', '.join(bad) or 'nothing'} is not a figure format; "
            f"choose from: {', '.join(figures.ALL_FORMATS)}"
        )
    if not (isinstance(dpi, int) and 50 <= dpi <= 1200):
        raise ConfigError(f"--dpi {dpi}: choose a whole number from 50 to 1200")
    low, high = figures.WIDTH_RANGE
    if not (isinstance(width, (int, float)) and low <= width <= high):
        raise ConfigError(
            f"--width {width}: choose a width in inches from {low:g} to {high:g} ({figures.SINGLE:g}: "
            f"a paper's single column, {figures.DOUBLE:g}: a double one)"
        )


def _grouped_runs(dirs: list[Path], filters, group_by, only=None) -> tuple[list, list, list]:
    """The runs below ``dirs`` (those whose real path is in ``only``, where given) that pass the filters, their
    groups, and the sweeps' jobs that never started (:mod:`.unstarted`, said on the console too); no run at
    all is an error."""
    found = load_runs(dirs)
    runs = found if only is None else [r for r in found if os.path.realpath(r.path) in only]
    if not runs:
        raise ConfigError(
            f"no runs below {', '.join(map(str, dirs))} (looked for summary.json, metrics.jsonl, .hydra/)"
        )
    for line in unreadable_summaries(runs):  # listed, never trusted: say which file, once, on the console
        print(f"normbench: warning: {line}", file=sys.stderr)
    missing = unstarted_jobs(dirs, found)  # over every run there: one ``only`` leaves out has started
    for sweep in missing:
        print(f"normbench: note: {sweep.line()}", file=sys.stderr)
    runs = filter_runs(runs, filters)
    return runs, group_runs(runs, group_by), missing


def _baseline(baseline: str | None, groups) -> tuple | None:
    """``--baseline KEY=VALUE`` parsed, once it names a grouping key and a value some group has; a near miss
    (``arch=preln``) is one line with the closest name and the allowed ones."""

    base = parse_assignment(baseline, "--baseline") if baseline else None
    if base and base[0] not in groups[0].settings:
        keys = list(groups[0].settings)
        near = difflib.get_close_matches(base[0], keys, n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise ConfigError(
            f"--baseline {baseline}: {base[0]!r} is not a grouping key{hint} (grouped by: "
            f"{', '.join(keys) or 'nothing'}; add it with --group-by)"
        )
    if base and not any(g.settings.get(base[0]) == base[1][0] for g in groups):
        seen = sorted({g.settings.get(base[0]) for g in groups})
        near = difflib.get_close_matches(base[1][0], seen, n=1, cutoff=0.6)
        hint = f" (did you mean {base[0]}={near[0]}?)" if near else ""
        raise ConfigError(
            f"--baseline {baseline}: no group has {base[0]}={base[1][0]}{hint}; choose one of: {', '.join(seen)}"
        )
    return base


def make_report(root, target_loss: float | None = None, steps: list[int] | None = None, out=None, **kw) -> Path:
    """Write report.md, report.html and the figures into ``out`` (default: the first directory);
    return the path of report.md. ``root``: a directory or a list of them. Raises ConfigError on bad input."""
    return build_report(root, target_loss, steps, out, **kw)[0]
