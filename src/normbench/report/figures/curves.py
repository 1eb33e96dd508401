"""Loss curves and quantities against depth (conventions: :mod:`.figures`).

``loss_curves``: (a) the whole run, train loss on a linear axis with the no-context baseline, and
(b) the validation loss zoomed on the later part of training, where the y-range is set by the mean
curves and their seed bands alone: the gaps between groups that (a) squeezes into its floor fill (b).
Stuck and diverged runs sit above a zoomed range; they are clipped and marked on its top edge.

``lr_grad_norm``: (a) the learning rate and (b) the total gradient norm before clipping, as logged at every
log step, so a reader sees the schedule each group ran and whether its gradients blew up or sat at the clip.

Both are curves of ``metrics.jsonl``'s log steps, so both follow ``report --x`` (:data:`.X_AXES`: the step,
the tokens trained or the wall-clock seconds of each record; a group's mean line sits at the mean over its
runs of their own x at each step, which only differs between seeds for the seconds) and ``report --runs``
(each run's own line, thin, under its group's mean; the min-max band is left out, the runs are its edges).

Depth profiles: one panel per chosen step, each with its own y-range (values shrink by orders of
magnitude during training, and one shared range would flatten the later panels), on one scale for the
whole figure: logarithmic in every panel when any panel's values span more than 30x (the panels show one
quantity, so a reader compares their shapes; a scale switching from panel to panel would hide that).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from string import ascii_lowercase

from normbench.analysis.loading import Group, Run, finite_series, series, setting
from normbench.analysis.stats import curve, healthy
from normbench.diag.outcomes import finite
from normbench.errors import ConfigError
from normbench.report.figures import (
    DEFAULT_OUT,
    LOSS_LABEL,
    X_AXES,
    Output,
    Styles,
    finish_figure,
    is_wide,
    new_figure,
    panel_title,
    rc,
    set_log,
)
from normbench.report.figures.lines import baselines_of, mean_band, own_line, run_kind, single_line

DEPTH_LABEL = "depth l"  # 0: the embedding output, l: after block l (the captions say it)
DEPTH = {  # metric -> (file, y label, caption, x label, first position: 0 for the stream, 1 for blocks)
    "var_resid": (
        "var_resid_depth.png",
        "Var(h_l)",
        "Variance of the residual stream h_l against depth",
        DEPTH_LABEL,
        0,
    ),
    "grad_norm_layer": (
        "grad_norm_layer_depth.png",
        "‖grad‖ of block l",
        "Gradient L2 norm of each block (before clipping) against depth",
        "block l",
        1,
    ),
    "maxabs_resid": (
        "maxabs_resid_depth.png",
        "max |h_l|",
        "Largest activation |h_l| of the residual stream against depth (massive activations)",
        DEPTH_LABEL,
        0,
    ),
}
ALT = {  # each depth figure in words, for its image's alt text
    "var_resid": "variance of the residual stream against depth, one panel per training step",
    "grad_norm_layer": "gradient norm of each block against depth, one panel per training step",
    "maxabs_resid": "largest activation of the residual stream against depth, one panel per training step",
}
ZOOM_FROM = 0.3  # the zoomed panel starts at the first evaluation after this fraction of the run


def x_of(run: Run, x: str) -> dict[int, float] | None:
    """step -> the run's value of the x axis ``x`` (:data:`.X_AXES`) at that step; None for steps themselves.
    A later record wins, as in :func:`series` (a resumed run logs again the steps after its checkpoint)."""
    if x == "step":
        return None
    return dict(finite_series(run.records, X_AXES[x][0]))


def _points(run: Run, key: str, start: float, x: str) -> tuple[list[float], list[float]]:
    """A run's own (x, value) of ``key`` from step ``start`` on, on the x axis ``x``."""
    at = x_of(run, x)
    pts = [(s if at is None else at.get(s), v) for s, v in finite_series(run.records, key) if s >= start]
    pts = [(a, v) for a, v in pts if a is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def _means(
    ax, groups: list[Group], styles: Styles, key: str, start: float, points: bool, x: str = "step", runs: bool = False
) -> list[float]:
    """Each group's mean curve of ``key`` from step ``start`` on, with its seed band (``runs``: with its runs'
    own lines instead); returns the values drawn."""
    values = []
    for g in groups:
        st = styles.of[g.label]
        pool = healthy(g.runs)
        steps, mean, lo, hi = curve(pool, key)
        at = [x_of(r, x) for r in pool]
        xs = [s if x == "step" else statistics.fmean(v) if (v := [a[s] for a in at if s in a]) else None for s in steps]
        kept = [(a, m, b, c) for s, a, m, b, c in zip(steps, xs, mean, lo, hi) if s >= start and a is not None]
        if kept:
            xs, mean, lo, hi = (list(c) for c in zip(*kept))
            for r in pool if runs else []:
                own_line(ax, r, *_points(r, key, start, x), st)
            mean_band(ax, xs, mean, lo, hi, st, 1 if runs else len(pool), marker=st["point"] if points else None)
            values += lo + hi
    return values


def _singles(ax, groups: list[Group], styles: Styles, key: str, start: float, top=None, x: str = "step") -> set[str]:
    """The runs not in a mean curve (stuck, diverged, failed), one by one; returns their kinds."""
    kinds = set()
    for g in groups:
        pool = healthy(g.runs)
        for r in g.runs:
            if r not in pool and (pts := _points(r, key, start, x))[0]:
                single_line(ax, *pts, styles.of[g.label], run_kind(r), top=top)
                kinds.add(run_kind(r))
    return kinds


def _limits(values: list[float], pad: float = 0.08) -> tuple[float, float] | None:
    vals = [v for v in values if finite(v)]
    if not vals or max(vals) <= min(vals):
        return None
    span = max(vals) - min(vals)
    return min(vals) - pad * span, max(vals) + pad * span


def zoom_start(groups: list[Group], key: str) -> float:
    """The first logged step of ``key`` at or after :data:`ZOOM_FROM` of the longest run."""
    steps = sorted({s for g in groups for r in g.runs for s, _ in finite_series(r.records, key)})
    if len(steps) < 3:
        return steps[0] if steps else 0
    later = [s for s in steps if s >= ZOOM_FROM * steps[-1]]
    return later[0] if len(later) >= 2 else steps[-2]


def missing(groups: list[Group], keys: tuple[str, ...]) -> str | None:
    """The first of ``keys`` (metrics.jsonl keys) that no run logged: its figure is skipped, saying so."""
    runs = [r for g in groups for r in g.runs]
    return next((k for k in keys if not any(finite_series(r.records, k) for r in runs)), None)


def plot_losses(
    groups: list[Group], styles: Styles, path: Path, out: Output = DEFAULT_OUT, x: str = "step", runs: bool = False
) -> bool:
    """The loss figure on the x axis ``x`` (:data:`.X_AXES`), with each run's own line when ``runs``; False
    (nothing drawn) when no run logged a loss or the x axis's key."""
    if missing(groups, ("loss", X_AXES[x][0])):
        return False
    with rc(out.width):
        _plot_losses(groups, styles, path, out, [r for g in groups for r in g.runs], x, runs)
    return True


def _plot_losses(groups, styles, path, out, runs, x, own) -> None:
    zkey = "val_loss" if any(len(finite_series(r.records, "val_loss")) >= 2 for r in runs) else "loss"
    fig, (full, zoom), _ = new_figure(2, out.width, spare_legend=False)
    extras = {"runs" if own else "band"}
    # (a): the whole run; a diverged run's blow-up would flatten everything else, so it sets no limit
    kept = [v for r in runs if r.status != "diverged" for _, v in finite_series(r.records, "loss")]
    kept += baselines_of(runs) if kept else []
    lim = _limits(kept, 0.05)
    _means(full, groups, styles, "loss", -math.inf, False, x, own)
    kinds = _singles(full, groups, styles, "loss", -math.inf, top=lim[1] if lim else None, x=x)
    if lim:
        full.set_ylim(*lim)
    for b in baselines_of(runs):
        full.axhline(b, color="0.4", lw=1, linestyle=":")
        extras.add("baseline")
    panel_title(full, "a  train loss, whole run")
    # (b): the later part, its range set by the mean curves and bands only
    start = zoom_start(groups, zkey)
    zlim = _limits(_means(zoom, groups, styles, zkey, start, zkey == "val_loss", x, own))
    kinds |= _singles(zoom, groups, styles, zkey, start, top=zlim[1] if zlim else None, x=x)
    if zlim:
        zoom.set_ylim(*zlim)
    panel_title(zoom, f"b  {'val' if zkey == 'val_loss' else 'train'} loss from step {start:g} (zoom)")
    for ax in (full, zoom):
        ax.set_xlabel(X_AXES[x][1])
    full.set_ylabel(LOSS_LABEL)
    order = [e for e in ("band", "runs", "stuck", "diverged", "failed", "baseline") if e in extras | kinds]
    finish_figure(fig, styles, order, path, out)


X_NOTES = {  # what a caption says of a non-default x axis
    "step": "",
    "tokens": " (`tokens` of metrics.jsonl: tokens trained so far)",
    "time": " (`time_s` of metrics.jsonl, evaluation included; a group's line at its seeds' mean time per step)",
}
RUNS_NOTE = " Thin lines: each run on its own; thick: the group's mean (no band: the runs are its edges)."


def caption_losses(groups: list[Group], x: str = "step", runs: bool = False) -> str:
    rs = [r for g in groups for r in g.runs]
    zkey = "val_loss" if any(len(finite_series(r.records, "val_loss")) >= 2 for r in rs) else "loss"
    what = "validation loss at its evaluations" if zkey == "val_loss" else "training loss"
    return (
        f"Loss against {X_AXES[x][1]}{X_NOTES[x]}. (a) Training loss over the whole run, the no-context "
        f"baseline (unigram entropy) dotted. (b) The {what} from step {zoom_start(groups, zkey):g} on, its "
        "y-range fitted to the mean curves, so the differences between groups show." + (RUNS_NOTE if runs else "")
    )


DYNAMICS = (  # metrics.jsonl key, panel title, y label
    ("lr", "learning rate", "learning rate"),
    ("grad_norm", "gradient norm (before clipping)", "‖grad‖, all parameters"),
)
DYNAMICS_ALT = "learning rate and total gradient norm against training step, one line per group"


def plot_dynamics(
    groups: list[Group], styles: Styles, path: Path, out: Output = DEFAULT_OUT, x: str = "step", runs: bool = False
) -> bool:
    """``lr_grad_norm.png``: the learning rate and the gradient norm, a panel each (the one logged, when a run
    logged only one); False when no run logged either, or the x axis's key."""
    keys = [k for k in DYNAMICS if not missing(groups, (k[0],))]
    if not keys or missing(groups, (X_AXES[x][0],)):
        return False
    with rc(out.width):
        _plot_dynamics(groups, styles, path, out, keys, x, runs)
    return True


def _clip(groups: list[Group]) -> float | None:
    """The gradient-clipping threshold (``trainer.grad_clip``; 0 is off) every run that records one shares,
    else None (the runs disagree: no one line to draw)."""
    clips = {c for g in groups for r in g.runs if (c := setting(r, "trainer.grad_clip")) is not None}
    if len(clips) != 1:
        return None
    try:
        clip = float(clips.pop())
    except ValueError:
        return None
    return clip if clip > 0 else None


def _plot_dynamics(groups, styles, path, out, keys, x, own) -> None:
    fig, axes, _ = new_figure(len(keys), out.width, spare_legend=False)
    extras, kinds = {"runs" if own else "band"}, set()
    for i, (ax, (key, title, label)) in enumerate(zip(axes, keys)):
        values = _means(ax, groups, styles, key, -math.inf, False, x, own)
        clip = _clip(groups) if key == "grad_norm" else None
        if clip is not None:
            ax.axhline(clip, color="0.4", lw=1, linestyle=":")
            extras.add("clip")
            values.append(clip)
        # the mean curves and the clip set the range: a diverged run's blow-up is clipped, marked on the top edge
        wide = key == "grad_norm" and is_wide(values)
        pos = [v for v in values if finite(v) and v > 0]
        lim = (min(pos) / 1.3, max(pos) * 1.3) if wide and pos else _limits(values)
        kinds |= _singles(ax, groups, styles, key, -math.inf, top=lim[1] if lim else None, x=x)
        if wide:
            set_log(ax)
        if lim:
            ax.set_ylim(*lim)
        if key == "lr":
            ax.set_ylim(bottom=0)  # a schedule is read against zero (warmup from it, decay towards it)
        ax.set(xlabel=X_AXES[x][1], ylabel=label)
        panel_title(ax, f"{'ab'[i]}  {title}")
    order = [e for e in ("band", "runs", "stuck", "diverged", "failed", "clip") if e in extras | kinds]
    finish_figure(fig, styles, order, path, out)


def caption_dynamics(groups: list[Group], x: str = "step", runs: bool = False) -> str:
    clip = _clip(groups)
    return (
        f"Learning rate and gradient norm against {X_AXES[x][1]}{X_NOTES[x]}, as logged at every log step. "
        "(a) The learning rate of the first parameter group (`lr`): the warmup and the schedule each group "
        "ran. (b) The L2 norm of all gradients before clipping (`grad_norm`), on a logarithmic axis where it "
        "spans more than 30×"
        + (f"; the clipping threshold ({clip:g}) dotted: above it, the step was clipped." if clip else ".")
        + (RUNS_NOTE if runs else "")
    )


def _profile(run: Run, key: str, step) -> tuple[int, list[float]] | None:
    """(diag step, per-layer list) at ``step`` ("end": the run's last diag record): the run's last
    record at or before it, if the run got that far."""
    pts = [(s, v) for s, v in series(run.records, key) if isinstance(v, list) and v]
    if not pts:
        return None
    if step == "end":
        return pts[-1]
    before = [(s, v) for s, v in pts if s <= step]
    return before[-1] if before and pts[-1][0] >= step else None


def default_depth_steps(groups: list[Group], key: str) -> list[int]:
    """The first and a middle diagnostic step (the last is always drawn, as "end of training")."""
    have = sorted({s for g in groups for r in g.runs for s, v in series(r.records, key) if isinstance(v, list)})
    if not have:
        return []
    return list(dict.fromkeys([have[0], have[len(have) // 2]]))


def _mean_profile(profs: list[list[float]]) -> tuple[list[float], list[float], list[float]]:
    n = len(profs[0])
    cols = [[p[i] for p in profs if finite(p[i])] for i in range(n)]
    return (
        [statistics.fmean(c) if c else math.nan for c in cols],
        [min(c) if c else math.nan for c in cols],
        [max(c) if c else math.nan for c in cols],
    )


def _depth_panel(ax, groups: list[Group], styles: Styles, key: str, step, first: int) -> tuple[list, set, set]:
    """One step's profiles; returns (values drawn, kinds of single runs, the end steps of the runs)."""
    values, kinds, ends = [], set(), set()
    for g in groups:
        st = styles.of[g.label]
        pool = healthy(g.runs)
        profs = [p[1] for r in pool if (p := _profile(r, key, step)) is not None]
        n = max((len(p) for p in profs), default=0)
        profs = [p for p in profs if len(p) == n]
        if profs:
            mean, lo, hi = _mean_profile(profs)
            mean_band(ax, list(range(first, first + n)), mean, lo, hi, st, len(profs), marker=st["point"])
            values += lo + hi
            if step == "end":
                ends |= {p[0] for r in pool if (p := _profile(r, key, "end"))}
        for r in g.runs:  # stuck and diverged runs: their last record at or before the panel's step
            if r in pool:
                continue
            pts = [(s, v) for s, v in series(r.records, key) if isinstance(v, list) and v]
            pts = [p for p in pts if step == "end" or p[0] <= step]
            if pts:
                ys = [v if finite(v) else math.nan for v in pts[-1][1]]
                single_line(ax, list(range(first, first + len(ys))), ys, st, run_kind(r), along=True)
                kinds.add(run_kind(r))
                values += ys
    return values, kinds, ends


def plot_depth(
    groups: list[Group], styles: Styles, key: str, steps: list[int], path: Path, out: Output = DEFAULT_OUT
) -> bool:
    with rc(out.width):
        return _plot_depth(groups, styles, key, steps, path, out)


def _plot_depth(groups, styles, key, steps, path, out) -> bool:
    _, ylabel, _, xlabel, first = DEPTH[key]
    panels = [*steps, "end"]
    fig, axes, legend_ax = new_figure(len(panels), out.width)
    kinds, drawn, wide = set(), False, False
    for i, (ax, step) in enumerate(zip(axes, panels)):
        values, k, ends = _depth_panel(ax, groups, styles, key, step, first)
        kinds |= k
        drawn |= bool(values)
        wide |= is_wide(values)
        name = f"step {step}" if step != "end" else "end" + (f" (step {next(iter(ends))})" if len(ends) == 1 else "")
        panel_title(ax, f"{ascii_lowercase[i % 26]}  {name}")  # --steps may ask for many panels
        ax.set_xlabel(xlabel)
        ax.xaxis.get_major_locator().set_params(integer=True)
    if not drawn:
        return False
    for i, ax in enumerate(axes):  # one scale for the figure: the panels show one quantity
        if wide:
            set_log(ax)
        if i % ax.get_gridspec().ncols == 0:
            ax.set_ylabel(ylabel)
    order = [e for e in ("band", "stuck", "diverged", "failed") if e in {"band"} | kinds]
    finish_figure(fig, styles, order, path, out, legend_ax=legend_ax)
    return True


def caption_depth(key: str, steps: list, groups: list[Group]) -> str:
    _, _, what, _, first = DEPTH[key]
    stuck = any(r not in healthy(g.runs) for g in groups for r in g.runs)
    return (
        f"{what}, at steps {', '.join(map(str, steps))} and at the end of training; each panel has its own "
        "y-range, all on one scale (logarithmic where any panel's values span more than 30×)"
        + ("; blocks numbered 1..L" if first else "; l = 0 is the embedding output, l the stream after block l")
        + ("; stuck/diverged runs drawn one by one at their last record." if stuck else ".")
    )


def check_x(x: str) -> None:
    """``--x``: one of :data:`X_AXES`."""
    if x not in X_AXES:
        raise ConfigError(f"--x={x} is not allowed; choose one of: {', '.join(X_AXES)}")
