"""``python -m normbench report DIR [DIR ...]``: collect, write report.md/report.html and figures."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from normbench.analysis.loading import (
    check_key,
    filter_runs,
    group_runs,
    load_runs,
    load_yaml,
    parse_assignment,
    unreadable_summaries,
)
from normbench.analysis.stats import default_targets, eval_spacing
from normbench.analysis.unstarted import unstarted_jobs
from normbench.diag.outcomes import MASSIVE_THRESHOLD, STUCK_MARGIN
from normbench.errors import ConfigError, Parser, error
from normbench.report import downstream, figures, table_files, tables, verdicts
from normbench.report.figures import curves as curve_figures
from normbench.report.figures import layers as layer_figures
from normbench.report.page import to_html, to_markdown
from normbench.report.setup import setup_rows

DASH = "—"


def _target_text(target, defaults) -> str:
    if target is not None:
        return f"{target:g} (given)"
    if not defaults:
        return f"{DASH} (no run learned; give --target)"
    per = ", ".join(f"{v:g} on {c}" if len(defaults) > 1 else f"{v:g}" for c, v in defaults.items())
    return f"{per} (the largest best val loss among the runs that learned, rounded up: every learned run reached it)"


def build_report(dirs, target=None, steps=None, out=None, group_by=None, filters=None, baseline=None,
                 color_by=None, style_by=None, figures_too=True, *, metric: str = "best val loss",
                 formats: tuple[str, ...] = figures.FORMATS, dpi: int = figures.DPI, width: float = figures.WIDTH,
                 title: str | None = None, head: list[tuple] = (), x: str = "step", runs_too: bool = False,
                 ) -> tuple[Path, Path, list[Path], int]:  # fmt: skip
    """Write the report; return (report.md, report.html, figure paths, number of runs). Every input is
    checked before anything is written; the sections then follow in the order a reader asks: the
    answer (the verdict and setup boxes), the runs and their outcomes, time to target, per-layer
    statistics, the baseline, the LR sweep, Optuna, every run, the figures. ``title``: the page's heading
    and ``<title>`` (default: the sweep's, :func:`sweep_title`); ``head``: blocks before the answer (the
    claim page of ``reproduce``: its claim, verdict and figure). ``x``: the x axis of the loss and
    LR/grad-norm curves (``step``, ``tokens``, ``time``); ``runs_too``: each run's own line in them. The
    tables are written as data beside report.md too (:mod:`.table_files`)."""
    dirs = [Path(d) for d in ([dirs] if isinstance(dirs, (str, Path)) else dirs)]
    runs, groups, missing = _grouped_runs(dirs, filters, group_by)
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
    blocks = [("h", 1, title), *head, _answer(groups, chosen, metric, target, defaults)]
    blocks += _unstarted_section(missing) + _overview(dirs, runs, groups, filters, target, defaults)
    blocks += downstream.downstream_section(groups) + _layer_section(groups)
    if base:
        blocks += _baseline_section(groups, baseline, base, target, defaults)
    sweep = tables.lr_sweep(groups)
    if sweep:
        blocks += _lr_section(sweep)
    blocks += _optuna_sections(dirs)
    blocks += [("h", 2, "All runs"), ("p", table_files.NOTE), ("table", *tables.runs_table(groups, target, defaults))]

    styles = figures.Styles(groups, color_by, style_by)
    plots: list[Path] = []
    if figures_too:
        blocks += [("h", 2, "Figures"), ("p", f"Every figure: {figures.setup_caption(groups)}")]
        save = figures.Output(tuple(formats), dpi, width)
        _figures(blocks, plots, groups, styles, sweep, steps, out_dir, save, x, runs_too)
    table_files.write_tables(out_dir, groups, target, defaults)
    md_path, html_path = out_dir / "report.md", out_dir / "report.html"
    md_path.write_text(to_markdown(blocks), encoding="utf-8")
    html_path.write_text(to_html(blocks, out_dir, title), encoding="utf-8")
    return md_path, html_path, plots, len(runs)


def sweep_title(dirs: list[Path], runs, groups) -> str:
    """``normbench report: arch × norm, 12 runs (14-03-27)``: what was varied, how many runs, and where."""
    varied = " × ".join(groups[0].settings) if groups and groups[0].settings else "one group"
    where = ", ".join(d.resolve().name or str(d) for d in dirs)
    return f"normbench report: {varied}, {len(runs)} runs ({where})"


def check_formats(formats, dpi, width: float = figures.WIDTH) -> None:
    bad = [f for f in formats if f not in figures.ALL_FORMATS]
    if bad or not formats:
        raise ConfigError(f"--format {','.join(formats)}: {', '.join(bad) or 'nothing'} is not a figure format; "
                          f"choose from: {', '.join(figures.ALL_FORMATS)}")  # fmt: skip
    if not (isinstance(dpi, int) and 50 <= dpi <= 1200):
        raise ConfigError(f"--dpi {dpi}: choose a whole number from 50 to 1200")
    low, high = figures.WIDTH_RANGE
    if not (isinstance(width, (int, float)) and low <= width <= high):
        raise ConfigError(f"--width {width}: choose a width in inches from {low:g} to {high:g} ({figures.SINGLE:g}: "
                          f"a paper's single column, {figures.DOUBLE:g}: a double one)")  # fmt: skip


def _answer(groups, chosen, metric: str, target, defaults) -> tuple:
    """The verdict box (each varied factor against its baseline) beside the setup box (what was held fixed)."""
    if len(groups) < 2:
        verdict = [("p", "One group: nothing was varied to compare (group the runs with `--group-by`).")]
    else:
        box = verdicts.verdict_box(groups, chosen, metric, target, defaults)
        bases = ", ".join(f"`{k}={v}`" for k, v in verdicts.baselines(groups, chosen).items())
        verdict = [("p", f"**{box.no_verdict}**")] if box.no_verdict else []
        verdict += [("p", f"Effect on the **{metric}** ({verdicts.better_word(metric, groups)} is better) of each "
                          f"value against the baseline ({bases}; `--baseline` picks another), within each setting "
                          "of the other factors and pooled with the **seed as the unit**: per seed, the difference "
                          "averaged over those settings, then the 95% t-interval over seeds (paired where both "
                          "sides ran the same seeds, else Welch's over the per-seed means; `2 seeds x 2 settings`: "
                          "each seed's difference is the mean over 2 settings). The box makes "
                          f"**{box.comparisons} comparisons** (every pair of values within a factor); a difference "
                          "is called, and ranked, only where it survives Holm's adjustment for all of them. An "
                          "interval that contains 0: **no detectable difference**."),
                    ("table", box.header, box.rows)]  # fmt: skip
        verdict += [
            ("p", f"Ranking, only where the intervals separate after Holm's adjustment: {r}") for r in box.ranks
        ]
    return ("boxes", [("Verdict", verdict), ("Setup", [("table", ["held fixed", "value"], setup_rows(groups))])])


def _grouped_runs(dirs: list[Path], filters, group_by) -> tuple[list, list, list]:
    """The runs below ``dirs`` that pass the filters, their groups, and the sweeps' jobs that never started
    (:mod:`.unstarted`, said on the console too); no run at all is an error."""
    runs = load_runs(dirs)
    if not runs:
        raise ConfigError(
            f"no runs below {', '.join(map(str, dirs))} (looked for summary.json, metrics.jsonl, .hydra/)"
        )
    for line in unreadable_summaries(runs):  # listed, never trusted: say which file, once, on the console
        print(f"normbench: warning: {line}", file=sys.stderr)
    missing = unstarted_jobs(dirs, runs)
    for sweep in missing:
        print(f"normbench: note: {sweep.line()}", file=sys.stderr)
    runs = filter_runs(runs, filters)
    return runs, group_runs(runs, group_by), missing


def _baseline(baseline: str | None, groups) -> tuple | None:
    """``--baseline KEY=VALUE`` parsed, once it names a grouping key and a value some group has; a near miss
    (``arch=preln``) is one line with the closest name and the allowed ones."""
    import difflib

    base = parse_assignment(baseline, "--baseline") if baseline else None
    if base and base[0] not in groups[0].settings:
        keys = list(groups[0].settings)
        near = difflib.get_close_matches(base[0], keys, n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise ConfigError(f"--baseline {baseline}: {base[0]!r} is not a grouping key{hint} (grouped by: "
                          f"{', '.join(keys) or 'nothing'}; add it with --group-by)")  # fmt: skip
    if base and not any(g.settings.get(base[0]) == base[1][0] for g in groups):
        seen = sorted({g.settings.get(base[0]) for g in groups})
        near = difflib.get_close_matches(base[1][0], seen, n=1, cutoff=0.6)
        hint = f" (did you mean {base[0]}={near[0]}?)" if near else ""
        raise ConfigError(f"--baseline {baseline}: no group has {base[0]}={base[1][0]}{hint}; choose one of: "
                          f"{', '.join(seen)}")  # fmt: skip
    return base


def _overview(dirs, runs, groups, filters, target, defaults) -> list[tuple]:
    """What the report covers and how to read it, the main table and time to target."""
    where = ", ".join(f"`{d}`" for d in dirs)
    return [
        ("h", 2, "Groups and outcomes"),
        ("p", (f"{len(runs)} runs in {len(groups)} groups below {where}"
               + (f", filtered by {', '.join(f'`{f}`' for f in filters)}" if filters else "")
               + f". Grouped by {', '.join(f'`{k}`' for k in groups[0].settings) or 'nothing (one group)'}; "
               "seeds averaged. Losses: mean ± sample std over the completed runs, the mean rounded to the "
               "std's precision ('partial': none completed yet, so the runs so far); rows by mean best val "
               "loss, which is not a ranking (the verdict box above says which differences are detectable). "
               f"**Outcomes**: `learned` beat the no-context baseline (unigram entropy of the validation split) "
               f"by more than {STUCK_MARGIN:g} nats, `unstable` learned with loss spikes, `stuck` did not beat it, "
               "`diverged` was stopped by the trainer; running, interrupted, stopped (killed: resumable) and "
               "failed runs have none yet. "
               f"Target val loss: {_target_text(target, defaults)}.")),
        ("table", *tables.main_table(groups, target, defaults)),
        ("h", 2, "Time to target"),
        ("p", _target_note(groups, target, defaults)),
        ("table", *tables.target_table(groups, target, defaults)),
    ]  # fmt: skip


def _unstarted_section(missing) -> list[tuple]:
    """The jobs of each half-finished sweep that never started (no directory, so in no table above)."""
    if not missing:
        return []
    blocks: list[tuple] = [("h", 2, "Jobs not started")]
    for sweep in missing:
        names = ", ".join(f"`{job}`" for job in sweep.jobs)
        blocks.append(("p", f"Sweep `{sweep.sweep}`: {len(sweep.jobs)} of its {sweep.total} jobs never started "
                            f"({names}). Finish the sweep (its stopped and interrupted jobs resume, completed ones "
                            f"stay) with: `{sweep.command}`"))  # fmt: skip
    return blocks


def _target_note(groups, target, defaults) -> str:
    """How time to target is measured, with the evaluation spacing, and a warning when that spacing is
    coarse against the spread of the step counts (then the table's steps resolve less than they show)."""
    spacing = eval_spacing([r for g in groups for r in g.runs])
    text = ("Steps, tokens and wall-clock seconds (since the run started, evaluation included) at which the val "
            "loss first reached the target, linearly interpolated between the two evaluations around the crossing; "
            "mean ± std over the runs that reached it.")  # fmt: skip
    if spacing is None:
        return text
    text += f" Evaluations every {spacing:g} steps: the crossing itself is only known to within {spacing:g} steps."
    spreads = tables.target_spreads(groups, target, defaults)
    if spreads and spacing > min(spreads):
        text += (f" **Coarse:** that spacing is wider than the spread of the step counts between seeds (std "
                 f"{min(spreads):.0f}-{max(spreads):.0f} steps), so step differences below {spacing:g} are not "
                 f"resolved; evaluate more often (e.g. `trainer.eval_every={max(1, int(spacing // 5))}`) to compare "
                 "them.")  # fmt: skip
    return text


def _layer_section(groups) -> list[tuple]:
    """Per-layer statistics at the end of training, when any completed run recorded them."""
    layer = tables.layer_table(groups)
    if not layer:
        return []
    return [("h", 2, "Per-layer statistics at the end of training"),
            ("p", "From the last diagnostic record of each completed run: variance growth = Var(h_L) / "
                  "Var(h_1) (after the last block over after the first); grad spread = first block's "
                  "gradient norm / last block's; CV = std / mean of the per-block gradient norms; massive "
                  f"ratio = max|h| / median|h| of the worst layer, its peak over the run and the first step "
                  f"it exceeded {MASSIVE_THRESHOLD:g}; max |logit| of the output."),
            ("table", *layer)]  # fmt: skip


def _baseline_section(groups, baseline: str, base: tuple, target, defaults) -> list[tuple]:
    return [("h", 2, f"Difference from {baseline}"),
            ("p", "Each group minus the group with the same settings but "
                  f"`{baseline}`: difference of the means over seeds with Welch's 95% t-interval "
                  "(needs two runs on each side). Negative loss or steps: better than the baseline."),
            ("table", *tables.baseline_table(groups, base[0], base[1][0], target, defaults))]  # fmt: skip


def _lr_section(sweep) -> list[tuple]:
    return [("h", 2, "Largest learning rate at which every seed learned"),
            ("p", "A learning rate counts when every run there with an outcome `learned` (not unstable, "
                  "stuck or diverged); runs without an outcome (running, stopped, failed) are named in brackets."),
            ("table", *tables.lr_table(sweep))]  # fmt: skip


def _optuna_sections(dirs: list[Path]) -> list[tuple]:
    """The best parameters of each Optuna search below ``dirs``: hydra/sweeper=optuna leaves
    optimization_results.yaml in its sweep dir, which may lie below the DIR given."""
    blocks: list[tuple] = []
    for d in dirs:
        for found in sorted(d.rglob("optimization_results.yaml")):
            optuna = load_yaml(found)
            if not (isinstance(optuna, dict) and "best_params" in optuna):
                continue
            best = ", ".join(f"`{k}={v}`" for k, v in (optuna.get("best_params") or {}).items())
            rel = "" if found.parent == d else f" ({found.parent.relative_to(d)})"
            blocks += [("h", 2, f"Optuna search{rel}"),
                       ("p", f"Best parameters: {best or DASH}; best value (best val loss): "
                             f"{optuna.get('best_value')}. Diverged trials count as 1e6, failed as inf.")]  # fmt: skip
    return blocks


def _figures(blocks, plots, groups, styles, sweep, steps, out_dir: Path, save: figures.Output, x: str = "step",
             runs_too: bool = False) -> None:  # fmt: skip
    """Each figure with its caption (the setup is stated once, above them); a figure without data is a line
    saying why instead of a hole. The PNG is embedded; the other formats lie next to it."""
    legend = (
        f" Colour: `{styles.color_key}`"
        + (
            f"; line style and point marker: `{styles.style_key}`"
            if styles.style_key and len(styles.linestyles) > 1
            else ""
        )
        + "."
    )

    def add(name: str, made: bool, what: str, key: str, caption: str, lines: bool = True) -> None:
        if made:
            stem = Path(name).stem
            plots.extend(out_dir / f"{stem}.{ext}" for ext in dict.fromkeys(("png", *save.formats)))
            others = ", ".join(f"`{stem}.{e}`" for e in save.formats if e != "png")
            also = f" (also {others})" if others else ""
            blocks.extend([("h", 3, f"`{name}`{also}"), ("img", name, what, caption + (legend if lines else ""))])
        else:  # say why instead of leaving a hole
            at = " at the chosen steps" if steps and key != "loss" else ""
            blocks.append(("p", f"`{name}` skipped: no run logged `{key}`{at}."))

    x_key, x_label = figures.X_AXES[x]
    caption = curve_figures.caption_losses(groups, x, runs_too)
    made = curve_figures.plot_losses(groups, styles, out_dir / "loss_curves.png", save, x, runs_too)
    add("loss_curves.png", made, f"training and validation loss against {x_label}, one line per group",
        curve_figures.missing(groups, ("loss", x_key)) or "loss", caption)  # fmt: skip
    caption = curve_figures.caption_dynamics(groups, x, runs_too)
    made = curve_figures.plot_dynamics(groups, styles, out_dir / "lr_grad_norm.png", save, x, runs_too)
    add("lr_grad_norm.png", made, curve_figures.DYNAMICS_ALT.replace("training step", x_label),
        curve_figures.missing(groups, (x_key,)) or "lr", caption)  # fmt: skip
    for key, (name, *_) in curve_figures.DEPTH.items():
        chosen = steps if steps else curve_figures.default_depth_steps(groups, key)
        made = curve_figures.plot_depth(groups, styles, key, chosen, out_dir / name, save)
        add(name, made, curve_figures.ALT[key], key, curve_figures.caption_depth(key, chosen, groups))
    for key, (name, *_) in layer_figures.HEATMAPS.items():
        made = layer_figures.plot_heatmap(groups, key, out_dir / name, save)
        add(name, made, layer_figures.ALT[key], key, layer_figures.caption_heatmap(key), lines=False)
    made = layer_figures.plot_layer_stats(groups, styles, out_dir / "layer_stats.png", save)
    add("layer_stats.png", made, "per-layer statistics against training step, one panel each", "var_resid",
        layer_figures.LAYER_CAPTION)  # fmt: skip
    if sweep:
        figures.plot_lr(sweep, groups, styles, out_dir / "lr_sweep.png", save)
        add("lr_sweep.png", True, "best validation loss against the peak learning rate, one line per group",
            "val_loss", "Best validation loss against the peak learning rate: filled point, every seed learned; "
            "hollow, some did not; squares, stuck runs; ×, an lr where a run diverged.")  # fmt: skip


def make_report(root, target_loss: float | None = None, steps: list[int] | None = None, out=None, **kw) -> Path:
    """Write report.md, report.html and the figures into ``out`` (default: the first directory);
    return the path of report.md. ``root``: a directory or a list of them. Raises ConfigError on bad input."""
    return build_report(root, target_loss, steps, out, **kw)[0]


def _step_list(text: str) -> list[int]:
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected steps like 0,100,500, got {text!r}") from None


def _key_list(text: str) -> list[str]:
    keys = [k.strip() for k in text.split(",") if k.strip()]
    if not keys:
        raise argparse.ArgumentTypeError(f"expected keys like arch,norm, got {text!r}")
    return keys


def main(argv: list[str]) -> int:
    parser = Parser(prog="normbench report", description="Tables and figures for runs and sweeps.")
    parser.add_argument("dirs", nargs="+", type=Path, metavar="DIR", help="run or sweep directories (merged)")
    parser.add_argument("--target", "--target-loss", dest="target", type=float, metavar="LOSS",
                        help="val loss for the time-to-target columns (default: per corpus, the best loss every "
                             "learned run reached)")  # fmt: skip
    parser.add_argument("--group-by", type=_key_list, metavar="KEY[,KEY]", help="keys to group by (default: the "
                        "overrides that differ between runs); e.g. arch,norm or model.n_layer")  # fmt: skip
    parser.add_argument("--filter", action="append", metavar="KEY=VALUE[,VALUE]", dest="filters",
                        help="keep only runs with this setting (repeatable; all must hold)")  # fmt: skip
    parser.add_argument("--baseline", metavar="KEY=VALUE", help="show every group's difference from the group "
                        "with KEY=VALUE (and its other settings), with a 95%% interval over seeds")  # fmt: skip
    parser.add_argument(
        "--steps", type=_step_list, help="steps for the depth plots, e.g. 0,100 (the end is always drawn)"
    )
    parser.add_argument("--color-by", metavar="KEY", help="factor drawn as colour (default: arch if grouped by it)")
    parser.add_argument("--style-by", metavar="KEY", help="factor drawn as line style (default: norm if grouped by it)")
    parser.add_argument("--out", type=Path, help="where to write (default: the first DIR)")
    parser.add_argument("--no-figures", action="store_true", help="tables only (fast)")
    parser.add_argument("--metric", default="best_val_loss", help="the verdict box's metric (default %(default)s): "
                        f"{', '.join(verdicts.METRIC_NAMES)} or TASK/METRIC (eval.json)")  # fmt: skip
    parser.add_argument("--format", default=",".join(figures.FORMATS), metavar="FMT[,FMT]",
                        help=f"figure formats besides the PNG the report embeds: {', '.join(figures.ALL_FORMATS)} "
                             f"(default: {','.join(figures.FORMATS)})")  # fmt: skip
    parser.add_argument(
        "--dpi", type=int, default=figures.DPI, help=f"resolution of PNG figures (default {figures.DPI})"
    )
    parser.add_argument("--width", type=float, default=figures.WIDTH, metavar="INCHES",
                        help=f"the figures' printed width: {figures.SINGLE:g} (a paper's single column) or "
                             f"{figures.DOUBLE:g} (double, the default); every text 7 pt or more at it")  # fmt: skip
    parser.add_argument("--x", default="step", metavar="AXIS", help="the x axis of the loss and LR/grad-norm "
                        "curves: step, tokens or time (wall-clock seconds since the start; default: step)")  # fmt: skip
    parser.add_argument("--runs", action="store_true", help="in the loss and LR/grad-norm curves, each run's own "
                        "line (thin, its group's colour) under its group's mean, instead of the band")  # fmt: skip
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help: argparse has printed it
        return int(e.code or 0)
    except ConfigError as e:  # a usage error: one line, like any other bad input
        return error(str(e))
    try:
        metric = verdicts.metric_name(args.metric)
        formats = tuple(f.strip().lower() for f in args.format.split(",") if f.strip())
        md, page, plots, n = build_report(args.dirs, args.target, args.steps, args.out, args.group_by, args.filters,
                                          args.baseline, args.color_by, args.style_by, not args.no_figures,
                                          metric=metric, formats=formats, dpi=args.dpi, width=args.width,
                                          x=args.x, runs_too=args.runs)  # fmt: skip
    except ConfigError as e:
        print(f"normbench: error: {e}", file=sys.stderr)
        return 2
    print(f"normbench: report on {n} runs: {md}")
    print(f"normbench: html (figures embedded): {page}")
    print(f"normbench: tables as data: {', '.join(str(md.parent / f) for f in table_files.FILES)}")
    for p in plots:
        print(f"normbench: figure: {p}")
    return 0
