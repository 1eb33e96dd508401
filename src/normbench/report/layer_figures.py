"""Figures of the per-layer diagnostics over training: layer x step heatmaps (``grad_norm_layer``,
``var_resid``) and the per-layer statistics of :mod:`normbench.train.outcomes` against steps. The
conventions are :mod:`normbench.report.figures`'s."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from normbench.report.figures import STEP_LABEL, Styles, _figure, _finish, _kind, _mean_band, _single
from normbench.report.loading import Group, Run, series
from normbench.report.stats import healthy, run_layer_series
from normbench.train.outcomes import MASSIVE_THRESHOLD, finite

HEATMAPS = {
    "grad_norm_layer": ("grad_norm_layer_heatmap.png", "gradient L2 norm of the block", "block l"),
    "var_resid": ("var_resid_heatmap.png", "variance of the residual stream Var(h_l)", "depth l (0 = embedding)"),
}
LAYER_STATS = (  # series key, panel title, y label
    ("var_growth", "Variance growth across depth", "Var(h_L) / Var(h_1) (ratio)"),
    ("grad_spread", "Gradient spread, first vs last block", "‖grad block 1‖ / ‖grad block L‖ (ratio)"),
    ("grad_cv", "Unevenness of per-block gradients", "coefficient of variation (std / mean)"),
    ("massive_ratio_max", "Massive activations", "max|h| / median|h|, worst layer (ratio)"),
    ("logit_maxabs", "Output logit scale", "largest |output logit| (nats)"),
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
        rows.append([statistics.fmean(c) if (c := [v[i] for v in lists if finite(v[i]) and v[i] > 0]) else math.nan
                     for i in range(n)])  # fmt: skip
    return steps, rows


def plot_heatmap(groups: list[Group], key: str, path: Path) -> bool:
    import numpy as np
    from matplotlib.colors import LogNorm

    _, clabel, ylabel = HEATMAPS[key]
    mats = [(g, m) for g in groups if (m := _matrix(healthy(g.runs) or g.runs, key)) is not None]
    if not mats:
        return False
    vals = [x for _, (_, rows) in mats for row in rows for x in row if finite(x) and x > 0]
    if not vals:
        return False
    ncols = min(len(mats), 3)
    nrows = math.ceil(len(mats) / ncols)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3.9 * ncols + 1.2, 2.9 * nrows + 0.6), layout="constrained")
    axes = [a for row in fig.subplots(nrows, ncols, squeeze=False) for a in row]
    norm = LogNorm(vmin=min(vals), vmax=max(vals))  # one colour scale for every panel
    mesh = None
    for ax, (g, (steps, rows)) in zip(axes, mats):
        arr = np.array(rows, dtype=float).T  # layers x steps
        mesh = ax.pcolormesh(steps, range(arr.shape[0]), np.ma.masked_invalid(arr), shading="nearest", norm=norm,
                             cmap="viridis")  # fmt: skip
        stopped = [r for r in g.runs if r.status == "diverged"]
        note = f"\n{len(stopped)} of {len(g.runs)} diverged (drawn until it stopped)" if stopped else ""
        if g.runs and all(r.outcome == "stuck" for r in g.runs):
            note = "\nstuck: never beat the no-context baseline"
        ax.set_title(f"{g.label}{note}", fontsize="small")
        ax.set(xlabel=STEP_LABEL, ylabel=ylabel)
        ax.yaxis.get_major_locator().set_params(integer=True)
    for ax in axes[len(mats) :]:
        ax.set_axis_off()
    fig.colorbar(mesh, ax=axes, label=f"{clabel} (log scale)")
    fig.suptitle(f"{clabel.capitalize()} by layer and step (mean over seeds)", fontsize="medium")
    fig.savefig(path, dpi=110)
    return True


def plot_layer_stats(groups: list[Group], styles: Styles, path: Path) -> bool:
    per_run = {id(r): run_layer_series(r) for g in groups for r in g.runs}
    keys = [(k, t, y) for k, t, y in LAYER_STATS if any(per_run[id(r)].get(k) for g in groups for r in g.runs)]
    if not keys:
        return False
    ncols = 3
    fig, axes = _figure(math.ceil(len(keys) / ncols), ncols)
    extras = {"band"}
    for ax, (key, title, label) in zip(axes, keys):
        values = []
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
                _mean_band(ax, xs, [statistics.fmean(by_step[s]) for s in xs], lo, hi, st, len(pool), marker="o")
                values += lo + hi
            for r in g.runs:
                if r not in pool and (pts := per_run[id(r)].get(key)):
                    _single(ax, [p[0] for p in pts], [p[1] for p in pts], st, _kind(r))
                    extras.add(_kind(r))
                    values += [p[1] for p in pts]
        if key == "massive_ratio_max":
            ax.axhline(MASSIVE_THRESHOLD, color="0.4", lw=1, linestyle=":")
            extras.add("threshold")
        pos = [v for v in values if finite(v) and v > 0]
        if pos and max(pos) / min(pos) > 100:
            ax.set_yscale("log", nonpositive="mask")
        ax.set(xlabel=STEP_LABEL, ylabel=label)
        ax.set_title(title, fontsize="medium")
    for ax in axes[len(keys) :]:
        ax.set_axis_off()
    order = [e for e in ("band", "stuck", "diverged", "failed", "threshold") if e in extras]
    _finish(fig, axes[: len(keys)], styles, order, f"Per-layer statistics vs training step by {styles.describe()}",
            path)  # fmt: skip
    return True
