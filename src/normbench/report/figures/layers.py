"""Figures of the per-layer diagnostics over training: layer x step heatmaps (``grad_norm_layer``,
``var_resid``) and the per-layer statistics of :mod:`normbench.diag.outcomes` against steps. The
conventions are :mod:`normbench.report.figures`'s: blocks 1..L, depth 0 (embedding) .. L.

The massive-activation panel draws its threshold only when some run comes within a factor 3 of it;
otherwise a line at 100 would set the axis and flatten data near 5 (the panel then says how far below
the threshold the runs stayed). The empty sixth slot of the grid (2 x 3, or 3 x 2 at a single column)
holds the legend."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import numpy as np

from normbench.analysis.loading import Group, Run, series
from normbench.analysis.stats import healthy, run_layer_series
from normbench.diag.outcomes import MASSIVE_THRESHOLD, finite
from normbench.report.figures import (
    DEFAULT_OUT,
    STEP_LABEL,
    Output,
    Styles,
    finish_figure,
    font_pt,
    grid,
    log_if_wide,
    new_figure,
    panel_title,
    rc,
    set_log,
)
from normbench.report.figures.layout import fit_page
from normbench.report.figures.lines import mean_band, run_kind, single_line

HEATMAPS = {  # key -> (file, colour label, y label, first row's number, what the colour shows, the rows)
    "grad_norm_layer": (
        "grad_norm_layer_heatmap.png",
        "‖grad‖ of block l",
        "block l",
        1,
        "the gradient L2 norm of the block (before clipping)",
        "the blocks 1..L, bottom to top",
    ),
    "var_resid": (
        "var_resid_heatmap.png",
        "Var(h_l)",
        "depth l",
        0,
        "the variance of the residual stream",
        "the depths 0..L, bottom to top (0 is the embedding output, l the stream after block l)",
    ),
}
ALT = {  # each heatmap in words, for its image's alt text
    "grad_norm_layer": "heatmaps of each block's gradient norm by block and training step, one per group",
    "var_resid": "heatmaps of the residual-stream variance by depth and training step, one per group",
}


def caption_heatmap(key: str) -> str:
    _, _, _, _, colour, rows = HEATMAPS[key]
    return (
        f"Heatmaps, one panel per group in the sweep's order (the mean over its seeds): rows are {rows}, "
        f"columns the diagnostic steps on a step axis from 0, and the colour is {colour}, on one "
        "logarithmic colour scale shared by every panel (the bar on the right). White: no value."
    )


LAYER_STATS = (  # series key, panel title, y label
    ("var_growth", "variance growth", "Var(h_L) / Var(h_1)"),
    ("grad_spread", "gradient spread", "‖g_1‖ / ‖g_L‖"),
    ("grad_cv", "gradient unevenness", "CV of block ‖g‖"),
    ("massive_ratio_max", "massive activations", "max|h| / median|h|"),
    ("logit_maxabs", "output logit scale", "max |logit|"),
)
LAYER_CAPTION = (
    "Per-layer statistics against training step: (a) variance growth Var(h_L)/Var(h_1) of the "
    "residual stream from after block 1 to after block L; (b) gradient spread, block 1's gradient "
    "norm over block L's; (c) the coefficient of variation (std/mean) of the blocks' gradient "
    "norms; (d) the massive-activation ratio max|h|/median|h| of the worst layer; (e) the largest "
    "|output logit|."
)


def _matrix(runs: list[Run], key: str) -> tuple[list[int], list[list[float]]] | None:
    """(steps, per-step mean over runs of the per-layer list)."""
    by_step: dict[int, list[list[float]]] = {}
    for r in runs:
        for s, v in series(r.records, key):
            if isinstance(v, list) and v:
                by_step.setdefault(s, []).append(v)
    if not by_step:
        return None
    n = max(len(v) for vs in by_step.values() for v in vs)
    steps = sorted(by_step)
    rows = []
    for s in steps:
        lists = [v for v in by_step[s] if len(v) == n]
        rows.append(
            [
                statistics.fmean(c) if (c := [v[i] for v in lists if finite(v[i]) and v[i] > 0]) else math.nan
                for i in range(n)
            ]
        )
    return steps, rows


def plot_heatmap(groups: list[Group], key: str, path: Path, out: Output = DEFAULT_OUT) -> bool:
    mats = [(g, m) for g in groups if (m := _matrix(healthy(g.runs) or g.runs, key)) is not None]
    vals = [x for _, (_, rows) in mats for row in rows for x in row if finite(x) and x > 0]
    if not vals:
        return False
    with rc(out.width):
        _plot_heatmap(groups, key, path, out, mats, vals)
    return True


def _plot_heatmap(groups, key, path, out, mats, vals) -> None:
    from matplotlib.colors import LogNorm  # deferred (start-up time): matplotlib
    from matplotlib.figure import Figure  # deferred (start-up time): matplotlib

    _, clabel, ylabel, first, *_ = HEATMAPS[key]
    room = out.width - 0.6  # 0.6 in: the colour bar
    nrows, ncols, height = grid(len(mats), room, max_cols=3)
    # a heatmap row is 0.75 of a line panel's; many groups at a narrow width: more columns, not a taller page
    nrows, ncols, row_h = fit_page(len(mats), room, nrows, ncols, 0.75 * height, lambda r, c: 0.5)
    fig = Figure(figsize=(out.width, row_h * nrows + 0.5), layout="constrained")
    axes = [a for row in fig.subplots(nrows, ncols, squeeze=False, sharex=True, sharey=True) for a in row]
    norm = LogNorm(vmin=min(vals), vmax=max(vals))  # one colour scale for every panel
    mesh = None
    for i, (ax, (g, (steps, rows))) in enumerate(zip(axes, mats)):
        arr = np.array(rows, dtype=float).T  # layers x steps
        mesh = ax.pcolormesh(
            steps,
            range(first, first + arr.shape[0]),
            np.ma.masked_invalid(arr),
            shading="nearest",
            norm=norm,
            cmap="viridis",
        )
        stopped = [r for r in g.runs if r.status == "diverged"]
        note = f" ({len(stopped)}/{len(g.runs)} diverged)" if stopped else ""
        if g.runs and all(r.outcome == "stuck" for r in g.runs):
            note = " (stuck)"
        name = ", ".join(g.settings.values()) or g.label
        panel_title(ax, f"{'abcdefghijklmnop'[i % 16]}  {name}{note}", bold=False, size=font_pt("xtick.labelsize"))
        if i % ncols == 0:
            ax.set_ylabel(ylabel)
        if i >= len(mats) - ncols:
            ax.set_xlabel(STEP_LABEL)
        ax.yaxis.get_major_locator().set_params(integer=True)
        ax.set_xlim(left=0)  # training starts at step 0, whatever step the first diagnostic ran at
    for ax in axes[len(mats) :]:
        ax.set_axis_off()
    bar = fig.colorbar(mesh, ax=axes, label=f"{clabel} (log)", shrink=0.9)
    set_log(bar.ax, scale=False)  # plain tick labels; the bar's scale is the norm's
    out.save(fig, path)


def plot_layer_stats(groups: list[Group], styles: Styles, path: Path, out: Output = DEFAULT_OUT) -> bool:
    per_run = {id(r): run_layer_series(r) for g in groups for r in g.runs}
    keys = [(k, t, y) for k, t, y in LAYER_STATS if any(per_run[id(r)].get(k) for g in groups for r in g.runs)]
    if not keys:
        return False
    with rc(out.width):
        _plot_layer_stats(groups, styles, path, out, per_run, keys)
    return True


def _stat_panel(ax, groups: list[Group], styles: Styles, per_run: dict, key: str) -> tuple[list[float], set[str]]:
    values, kinds = [], set()
    for g in groups:
        st = styles.of[g.label]
        pool = healthy(g.runs)
        by_step: dict[int, list[float]] = {}
        for r in pool:
            for s, v in per_run[id(r)].get(key, []):
                by_step.setdefault(s, []).append(v)
        xs = sorted(by_step)
        if xs:
            lo, hi = [min(by_step[s]) for s in xs], [max(by_step[s]) for s in xs]
            mean_band(ax, xs, [statistics.fmean(by_step[s]) for s in xs], lo, hi, st, len(pool), marker=st["point"])
            values += lo + hi
        for r in g.runs:
            if r not in pool and (pts := per_run[id(r)].get(key)):
                single_line(ax, [p[0] for p in pts], [p[1] for p in pts], st, run_kind(r))
                kinds.add(run_kind(r))
                values += [p[1] for p in pts]
    return values, kinds


def _plot_layer_stats(groups, styles, path, out, per_run, keys) -> None:
    fig, axes, legend_ax = new_figure(len(keys), out.width, max_cols=3)  # the legend in a slot left empty, or below
    ncols = axes[0].get_gridspec().ncols
    extras = {"band"}
    for i, (ax, (key, title, label)) in enumerate(zip(axes, keys)):
        values, kinds = _stat_panel(ax, groups, styles, per_run, key)
        extras |= kinds
        top = max((v for v in values if finite(v)), default=0.0)
        if key == "massive_ratio_max" and top >= MASSIVE_THRESHOLD / 3:
            ax.axhline(MASSIVE_THRESHOLD, color="0.4", lw=1, linestyle=":")
            extras.add("threshold")
        elif key == "massive_ratio_max":  # said in the panel: the threshold line would flatten the data
            ax.text(
                0.98,
                0.04,
                f"threshold {MASSIVE_THRESHOLD:g}\nnot reached",
                transform=ax.transAxes,
                ha="right",
                va="bottom",
                fontsize=font_pt(),
                color="0.35",
            )
        log_if_wide(ax, values)
        ax.set_ylabel(label)
        if i >= len(keys) - ncols:
            ax.set_xlabel(STEP_LABEL)
        panel_title(ax, f"{'abcdefgh'[i]}  {title}")
    order = [e for e in ("band", "stuck", "diverged", "failed", "threshold") if e in extras]
    finish_figure(fig, styles, order, path, out, legend_ax=legend_ax)
