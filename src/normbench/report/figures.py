"""The report's figures (matplotlib, no pyplot: no global state, no GUI backend).

Conventions, the same in every figure: one colour per value of one factor (``arch`` when it
varies: a fixed colour per architecture) and one line style per value of a second (``norm``
when it varies), further factors by marker; one shared legend outside the axes; seeds drawn
as the mean line with a min-max band; validation points marked; panels of one quantity share
their y-range; a log axis when the values span more than 100x. Stuck and diverged runs are
never dropped: each is drawn on its own, thin, ending in a hollow square (stuck) or an x at
the step it stopped (diverged). Heatmaps and per-layer statistics: :mod:`.layer_figures`.
"""

from __future__ import annotations

import math
import statistics
import textwrap
from pathlib import Path

from normbench.model import norm_class
from normbench.report.loading import Group, Run, finite_series, is_lr_key, series, setting
from normbench.report.stats import LEARNED, curve, healthy, learned_everywhere
from normbench.train.outcomes import MASSIVE_THRESHOLD, finite

ARCH_COLORS = {
    "pre_ln": "tab:blue",
    "post_ln": "tab:orange",
    "peri_ln": "tab:green",
    "mix_ln": "tab:red",
    "hybridnorm": "tab:purple",
    "hybridnorm_star": "tab:brown",
    "deepnorm": "tab:pink",
    "ngpt": "tab:olive",
}
PALETTE = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive",
           "tab:cyan", "tab:gray")  # fmt: skip
LINE_STYLES = ("-", "--", ":", "-.", (0, (5, 1, 1, 1)), (0, (1, 3)))
MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*")
LOSS_LABEL = "cross-entropy loss (nats/token)"
STEP_LABEL = "training step (optimizer updates)"
DEPTH = {  # metric -> (file, y label, title, x label)
    "var_resid": ("var_resid_depth.png", "variance of the residual stream Var(h_l)",
                  "Residual-stream variance across depth", "depth l (0 = embedding output, l = after block l)"),
    "grad_norm_layer": ("grad_norm_layer_depth.png", "gradient L2 norm of block l (before clipping)",
                        "Per-block gradient norm", "block l"),
    "maxabs_resid": ("maxabs_resid_depth.png", "largest |activation| max|h_l|",
                     "Largest activation across depth (massive activations)",
                     "depth l (0 = embedding output, l = after block l)"),
}  # fmt: skip


def norm_styles(norms: list[str]) -> dict[str, object]:
    """Each norm's line style: the one its class declares (``line_style``, model/norm_api.py), else one of
    :data:`LINE_STYLES` that no declared norm in the figure has, so a new norm never shares LayerNorm's."""
    declared = {v: style for v in norms if (style := norm_class(v).line_style) is not None}
    free = [s for s in LINE_STYLES if s not in declared.values()] or list(LINE_STYLES)
    undeclared = [v for v in norms if v not in declared]
    return {v: declared.get(v) or free[undeclared.index(v) % len(free)] for v in norms}


def _numeric_sort(values):
    def key(v):
        try:
            return (0, float(v), "")
        except ValueError:
            return (1, 0.0, v)

    return sorted(values, key=key)


class Styles:
    """Colour, line style and marker of each group, from its values of up to three+ factors."""

    def __init__(self, groups: list[Group], color_by=None, style_by=None, exclude: tuple[str, ...] = ()):
        keys = [k for k in (groups[0].settings if groups else []) if k not in exclude]
        if not keys:  # one group with no varying key: name it by arch and norm
            keys = ["arch", "norm"]
        self.color_key = color_by or ("arch" if "arch" in keys else keys[0])
        rest = [k for k in keys if k != self.color_key]
        self.style_key = style_by or ("norm" if "norm" in rest else (rest[0] if rest else None))
        self.marker_keys = [k for k in rest if k != self.style_key]
        value = lambda g, k: g.settings.get(k) or setting(g.runs[0], k) or "?"  # noqa: E731
        self.value = value
        cvals = _numeric_sort({value(g, self.color_key) for g in groups})
        if self.color_key == "arch":  # the fixed order of the architectures' colours
            cvals.sort(key=lambda v: list(ARCH_COLORS).index(v) if v in ARCH_COLORS else len(ARCH_COLORS))
        others = [v for v in cvals if not (self.color_key == "arch" and v in ARCH_COLORS)]
        self.colors = {
            v: ARCH_COLORS[v] if self.color_key == "arch" and v in ARCH_COLORS else PALETTE[others.index(v) % 10]
            for v in cvals
        }
        svals = _numeric_sort({value(g, self.style_key) for g in groups}) if self.style_key else []
        self.linestyles = (
            norm_styles(svals)
            if self.style_key == "norm"
            else {v: LINE_STYLES[i % len(LINE_STYLES)] for i, v in enumerate(svals)}
        )
        mvals = sorted({tuple(value(g, k) for k in self.marker_keys) for g in groups}) if self.marker_keys else []
        self.markers = {v: MARKERS[i % len(MARKERS)] for i, v in enumerate(mvals)}
        self.of = {
            g.label: {
                "color": self.colors[value(g, self.color_key)],
                "linestyle": self.linestyles.get(value(g, self.style_key), "-") if self.style_key else "-",
                "marker": self.markers.get(tuple(value(g, k) for k in self.marker_keys)) if self.marker_keys else None,
            }
            for g in groups
        }

    def describe(self) -> str:
        parts = [f"colour: {self.color_key}"]
        if self.style_key and len(self.linestyles) > 1:
            parts.append(f"line style: {self.style_key}")
        if self.markers and len(self.markers) > 1:
            parts.append(f"marker: {', '.join(self.marker_keys)}")
        return "; ".join(parts)

    def handles(self, extras: tuple[str, ...] = ()) -> list:
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch

        h = [Line2D([], [], color=c, lw=2.5, label=f"{self.color_key} = {v}") for v, c in self.colors.items()]
        if self.style_key and len(self.linestyles) > 1:
            h += [Line2D([], [], color="0.3", linestyle=ls, lw=1.5, label=f"{self.style_key} = {v}")
                  for v, ls in self.linestyles.items()]  # fmt: skip
        if len(self.markers) > 1:
            h += [Line2D([], [], color="0.3", marker=m, linestyle="none", label=", ".join(f"{k} = {x}" for k, x in
                         zip(self.marker_keys, v))) for v, m in self.markers.items()]  # fmt: skip
        extra = {
            "band": Patch(color="0.6", alpha=0.3, label="mean over seeds; band: min–max"),
            "val": Line2D([], [], color="0.3", marker="o", ms=4, linestyle="none", label="evaluation point"),
            "stuck": Line2D([], [], color="0.3", lw=0.9, marker="s", mfc="none", label="stuck run (one line each)"),
            "diverged": Line2D([], [], color="0.3", lw=0.9, marker="x", mew=2, label="diverged run, × where stopped"),
            "failed": Line2D([], [], color="0.3", lw=0.9, marker="|", ms=9, label="failed/unfinished run"),
            "baseline": Line2D([], [], color="0.4", lw=1, linestyle=":", label="no-context baseline (unigram entropy)"),
            "threshold": Line2D([], [], color="0.4", lw=1, linestyle=":",
                                label=f"massive-activation threshold ({MASSIVE_THRESHOLD:g})"),
        }  # fmt: skip
        return h + [extra[e] for e in extras]


def _figure(nrows: int, ncols: int, sharey: bool = False, width: float = 4.3, height: float = 3.4):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * ncols + 2.6, height * nrows + 0.6), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, sharey=sharey)
    return fig, [a for row in axes for a in row]


def _finish(fig, axes, styles: Styles, extras, title: str, path: Path, values=None) -> None:
    if values:
        pos = [v for v in values if finite(v) and v > 0]
        if pos and max(pos) / min(pos) > 100:  # spans more than 100x
            for ax in axes:
                ax.set_yscale("log", nonpositive="mask")
    fig.legend(handles=styles.handles(tuple(extras)), loc="outside right center", fontsize="small", frameon=False)
    width = int(fig.get_figwidth() * 9)  # characters that fit above the axes, roughly
    fig.suptitle(textwrap.fill(title, width), fontsize="medium")
    fig.savefig(path, dpi=110)


def _kind(run: Run) -> str:
    """How a run not in the mean line is drawn."""
    if run.status == "diverged":
        return "diverged"
    if run.outcome == "stuck":
        return "stuck"
    return "failed"


END = {"diverged": {"marker": "x", "ms": 8, "mew": 2}, "stuck": {"marker": "s", "ms": 6, "mfc": "none"},
       "failed": {"marker": "|", "ms": 10, "mew": 1.5}}  # fmt: skip


def _single(ax, xs, ys, style: dict, kind: str, along: bool = False, top: float | None = None) -> None:
    """One stuck/diverged/failed run: thin, with its kind's marker at the end (or at every point);
    an end above ``top`` (the axes' upper limit) is marked on the top edge."""
    ax.plot(xs, ys, color=style["color"], linestyle=style["linestyle"], lw=0.9, alpha=0.6)
    pts = (xs, ys) if along else (xs[-1:], [min(ys[-1], top) if top is not None else ys[-1]])
    (end,) = ax.plot(*pts, linestyle="none", color=style["color"], clip_on=top is not None, **END[kind])
    end.set_in_layout(False)  # a marker on the top edge must not push the axes around


def _mean_band(ax, xs, mean, lo, hi, style: dict, n: int, marker=None) -> None:
    ax.plot(xs, mean, color=style["color"], linestyle=style["linestyle"], lw=1.6, marker=marker or style["marker"],
            ms=3.5, markevery=None if marker else 0.1)  # fmt: skip
    if n > 1:
        ax.fill_between(xs, lo, hi, color=style["color"], alpha=0.15, lw=0)


def _baselines(runs: list[Run]) -> list[float]:
    return sorted({round(b, 6) for r in runs if finite(b := (r.summary or {}).get("baseline_loss"))})


def plot_losses(groups: list[Group], styles: Styles, path: Path) -> bool:
    runs = [r for g in groups for r in g.runs]
    if not any(finite_series(r.records, "loss") for r in runs):
        return False
    has_val = any(finite_series(r.records, "val_loss") for r in runs)
    panels = [("loss", "Training loss (every logged step)")]
    panels += [("val_loss", "Validation loss (points: evaluations)")] if has_val else []
    fig, axes = _figure(1, len(panels), sharey=True)
    extras, values = {"band"}, []
    # the y range of the mean curves (and stuck runs): a diverged run's blow-up would flatten them
    kept = [v for g in groups for r in g.runs if r.status != "diverged" for k, _ in panels
            for _, v in finite_series(r.records, k)]  # fmt: skip
    kept += _baselines(runs) if kept else []
    top = bottom = None
    if kept and max(kept) > min(kept):  # else (e.g. every run diverged): matplotlib's own range
        top, bottom = max(kept) + 0.05 * (max(kept) - min(kept)), min(kept) - 0.05 * (max(kept) - min(kept))
    for ax, (key, title) in zip(axes, panels):
        for g in groups:
            st = styles.of[g.label]
            pool = healthy(g.runs)
            xs, mean, lo, hi = curve(pool, key)
            if xs:
                _mean_band(ax, xs, mean, lo, hi, st, len(pool), marker="o" if key == "val_loss" else None)
                values += lo + hi
            for r in g.runs:
                if r not in pool and (pts := finite_series(r.records, key)):
                    _single(ax, [p[0] for p in pts], [p[1] for p in pts], st, _kind(r), top=top)
                    extras.add(_kind(r))
                    values += [p[1] for p in pts if top is None or p[1] <= top]
        if top is not None:
            ax.set_ylim(bottom, top)
        for b in _baselines(runs):
            ax.axhline(b, color="0.4", lw=1, linestyle=":")
            extras.add("baseline")
        ax.set_title(title, pad=10)
        ax.set_xlabel(STEP_LABEL)
        if key == "val_loss":
            extras.add("val")
    axes[0].set_ylabel(LOSS_LABEL)
    order = [e for e in ("band", "val", "stuck", "diverged", "failed", "baseline") if e in extras]
    n_seeds = max((len(g.runs) for g in groups), default=1)
    seeds = f"mean of up to {n_seeds} seeds per line" if n_seeds > 1 else "one run per line"
    _finish(fig, axes, styles, order, f"Loss vs training step by {styles.describe()} ({seeds})", path, values)
    return True


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


def plot_depth(groups: list[Group], styles: Styles, key: str, steps: list[int], path: Path) -> bool:
    _, ylabel, title, xlabel = DEPTH[key]
    panels = [*steps, "end"]
    fig, axes = _figure(1, len(panels), sharey=True, width=3.8)
    extras, values, drawn, ends = {"band"}, [], False, set()
    for ax, step in zip(axes, panels):
        for g in groups:
            st = styles.of[g.label]
            pool = healthy(g.runs)
            profs = [p[1] for r in pool if (p := _profile(r, key, step)) is not None]
            n = max((len(p) for p in profs), default=0)
            profs = [p for p in profs if len(p) == n]
            if profs:
                cols = [[p[i] for p in profs if finite(p[i])] for i in range(n)]
                mean = [statistics.fmean(c) if c else math.nan for c in cols]
                lo = [min(c) if c else math.nan for c in cols]
                hi = [max(c) if c else math.nan for c in cols]
                _mean_band(ax, list(range(n)), mean, lo, hi, st, len(profs), marker=st["marker"] or "o")
                values += lo + hi
                drawn = True
                if step == "end":
                    ends |= {p[0] for r in pool if (p := _profile(r, key, "end"))}
            for r in g.runs:  # stuck and diverged runs: their last record at or before the panel's step
                if r in pool:
                    continue
                pts = [(s, v) for s, v in series(r.records, key) if isinstance(v, list) and v]
                pts = [p for p in pts if step == "end" or p[0] <= step]
                if pts:
                    ys = [v if finite(v) else math.nan for v in pts[-1][1]]
                    _single(ax, list(range(len(ys))), ys, st, _kind(r), along=True)
                    extras.add(_kind(r))
                    values += ys
                    drawn = True
        name = f"step {step}" if step != "end" else "end of training"
        if step == "end" and len(ends) == 1:
            name += f" (step {next(iter(ends))})"
        ax.set(title=name, xlabel=xlabel)
        ax.xaxis.get_major_locator().set_params(integer=True)
    if not drawn:
        return False
    axes[0].set_ylabel(ylabel)
    order = [e for e in ("band", "stuck", "diverged", "failed") if e in extras]
    _finish(fig, axes, styles, order, f"{title} by {styles.describe()}; stuck/diverged runs at their last record",
            path, values)  # fmt: skip
    return True


def plot_lr(sweep: dict[str, dict[float, list[Run]]], groups: list[Group], styles: Styles, path: Path) -> None:
    """Best val loss against lr, one line per series (the lr is the x axis, so not a line style)."""
    fig, axes = _figure(1, 1, width=5.5, height=4.2)
    ax = axes[0]
    lr_keys = tuple(k for k in (groups[0].settings if groups else {}) if is_lr_key(k))
    styles = Styles(groups, None if styles.color_key in lr_keys else styles.color_key, None, exclude=lr_keys)
    series_style = {g.series: styles.of[g.label] for g in groups}
    extras = {"band"}
    for label, by_lr in sweep.items():
        st = series_style[label]
        xs, mean, lo, hi, full = [], [], [], [], []
        for lr in sorted(by_lr):
            runs = by_lr[lr]
            bests = [b for r in runs if r.outcome in LEARNED and (b := r.val_losses[1]) is not None]
            if bests:
                xs.append(lr)
                mean.append(statistics.fmean(bests))
                lo.append(min(bests))
                hi.append(max(bests))
                full.append(learned_everywhere(runs))
            stuck = [b for r in runs if r.outcome == "stuck" and (b := r.val_losses[1]) is not None]
            if stuck:
                ax.plot([lr] * len(stuck), stuck, linestyle="none", color=st["color"], **END["stuck"])
                extras.add("stuck")
            if any(r.outcome == "diverged" for r in runs):
                ax.plot([lr], [0.97], color=st["color"], transform=ax.get_xaxis_transform(), **END["diverged"])
                extras.add("diverged")
        if xs:
            ax.plot(xs, mean, color=st["color"], linestyle=st["linestyle"], lw=1.6)
            ax.fill_between(xs, lo, hi, color=st["color"], alpha=0.15, lw=0)
            for x, y, ok in zip(xs, mean, full):  # filled: every seed learned; hollow: not every seed
                ax.plot([x], [y], "o", color=st["color"], mfc=st["color"] if ok else "white", ms=6)
    for b in _baselines([r for by_lr in sweep.values() for runs in by_lr.values() for r in runs]):
        ax.axhline(b, color="0.4", lw=1, linestyle=":")
        extras.add("baseline")
    ax.set(xscale="log", xlabel="peak learning rate (optim.lr)", ylabel=f"best validation {LOSS_LABEL}")
    ax.set_title("filled point: every seed learned; hollow: some did not", fontsize="small")
    order = [e for e in ("band", "stuck", "diverged", "baseline") if e in extras]
    _finish(fig, axes, styles, order, f"Best validation loss vs learning rate by {styles.describe()}", path)
