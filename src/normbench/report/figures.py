"""The report's figures: shared conventions, saving, and the learning-rate figure (matplotlib, no
pyplot: no global state, no GUI backend). Loss and depth figures: :mod:`.curve_figures`; heatmaps and
per-layer statistics: :mod:`.layer_figures`.

Conventions, the same in every figure: one colour per value of one factor (``arch`` when it
varies: a fixed colour per architecture) and one line style per value of a second (``norm``
when it varies), with a point marker per line style too (so overlapping lines stay apart), further
factors by marker; one shared legend below the axes; seeds drawn as the mean line with a min-max
band. Blocks are numbered 1..L everywhere; a depth position l is the residual stream after block l
(0: the embedding output). An axis is logarithmic when its own values span more than 30x. Stuck and
diverged runs are never dropped: each is drawn on its own, thin, ending in a hollow square (stuck)
or an x at the step it stopped (diverged).

Sizes are set for print: figures 6.6 in wide (two single columns) or less, fonts of 10-11 pt, so a
figure scaled down to a single column (3.3 in) still has 5 pt or larger text. Panel titles are
short; what a figure shows is its caption in the report. ``Output`` saves each figure as PNG (the
report embeds that) and in any of PDF and SVG, at ``dpi``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from normbench.diag.outcomes import MASSIVE_THRESHOLD, finite
from normbench.model import norm_class
from normbench.report.loading import Group, Run, is_lr_key, setting
from normbench.report.stats import LEARNED, learned_everywhere

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
POINT_MARKERS = ("o", "s", "^", "D", "v", "P")
LOSS_LABEL = "loss (nats/token)"
STEP_LABEL = "training step"
FORMATS = ("png", "pdf")
ALL_FORMATS = ("png", "pdf", "svg")
DPI = 200
WIDTH = 6.6  # inches: two single columns; see the module docstring
LOG_SPAN = 30  # an axis whose positive values span more than this factor is logarithmic
RC = {"font.size": 10, "axes.titlesize": 10.5, "axes.labelsize": 10, "xtick.labelsize": 9.5, "ytick.labelsize": 9.5,
      "legend.fontsize": 9.5, "lines.linewidth": 1.6, "axes.spines.top": False, "axes.spines.right": False,
      "pdf.fonttype": 42, "svg.fonttype": "none"}  # fmt: skip


@dataclass(frozen=True)
class Output:
    """How figures are saved: PNG always (the report embeds it), plus the other ``formats``, at ``dpi``."""

    formats: tuple[str, ...] = FORMATS
    dpi: int = DPI

    def save(self, fig, path: Path) -> None:
        for ext in dict.fromkeys(("png", *self.formats)):
            fig.savefig(path.with_suffix(f".{ext}"), dpi=self.dpi)


DEFAULT_OUT = Output()


def log_if_wide(ax, values) -> None:
    pos = [v for v in values if finite(v) and v > 0]
    if pos and max(pos) / min(pos) > LOG_SPAN:
        ax.set_yscale("log", nonpositive="mask")


def setup_caption(groups: list[Group]) -> str:
    """One sentence with what every figure shares: the runs, the model, steps and the seeds per line."""
    runs = [r for g in groups for r in g.runs]
    first = runs[0]
    model = setting(first, "model")
    size = ", ".join(f"{v} {k}" for k, v in (("blocks", setting(first, "model.n_layer")),
                                             ("wide", setting(first, "model.d_model"))) if v)  # fmt: skip
    steps = {s for r in runs if (s := setting(r, "trainer.max_steps"))}
    n_seeds = max((len(g.runs) for g in groups), default=1)
    parts = [f"{len(runs)} runs in {len(groups)} groups"]
    parts += [f"model {model}" + (f" ({size})" if size else "")] if model else []
    parts += [f"{next(iter(steps))} steps" if len(steps) == 1 else "steps differ between runs"] if steps else []
    parts.append(f"a line is the mean of up to {n_seeds} seeds, the band their min–max" if n_seeds > 1 else
                 "one run per line")  # fmt: skip
    return "; ".join(parts) + "."


def norm_styles(norms: list[str]) -> dict[str, object]:
    """Each norm's line style: the one its class declares (``line_style``, norm/norm_api.py), else one of
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
        self.points = {v: POINT_MARKERS[i % len(POINT_MARKERS)] for i, v in enumerate(svals)}
        self.of = {
            g.label: {
                "color": self.colors[value(g, self.color_key)],
                "linestyle": self.linestyles.get(value(g, self.style_key), "-") if self.style_key else "-",
                "marker": self.markers.get(tuple(value(g, k) for k in self.marker_keys)) if self.marker_keys else None,
                "point": self.points.get(value(g, self.style_key), "o") if self.style_key else "o",
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
            h += [Line2D([], [], color="0.3", linestyle=ls, lw=1.5, marker=self.points[v], ms=4,
                         label=f"{self.style_key} = {v}") for v, ls in self.linestyles.items()]  # fmt: skip
        if len(self.markers) > 1:
            h += [Line2D([], [], color="0.3", marker=m, linestyle="none", label=", ".join(f"{k} = {x}" for k, x in
                         zip(self.marker_keys, v))) for v, m in self.markers.items()]  # fmt: skip
        extra = {
            "band": Patch(color="0.6", alpha=0.3, label="seeds: min–max"),
            "stuck": Line2D([], [], color="0.3", lw=0.9, marker="s", mfc="none", label="stuck run"),
            "diverged": Line2D([], [], color="0.3", lw=0.9, marker="x", mew=2, label="diverged run (× stop)"),
            "failed": Line2D([], [], color="0.3", lw=0.9, marker="|", ms=9, label="unfinished run"),
            "baseline": Line2D([], [], color="0.4", lw=1, linestyle=":", label="no-context baseline"),
            "threshold": Line2D([], [], color="0.4", lw=1, linestyle=":",
                                label=f"massive threshold ({MASSIVE_THRESHOLD:g})"),
        }  # fmt: skip
        return h + [extra[e] for e in extras]


def _figure(nrows: int, ncols: int, sharey: bool = False, width: float = WIDTH, height: float = 2.6):
    """A figure ``width`` inches wide, ``height`` per row plus room for the legend below."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height * nrows + 0.7), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, sharey=sharey)
    return fig, [a for row in axes for a in row]


def _finish(fig, styles: Styles, extras, path: Path, out: Output, legend_ax=None) -> None:
    """The shared legend (below the axes, or in ``legend_ax``, an empty panel), then save."""
    handles = styles.handles(tuple(extras))
    if legend_ax is not None:
        legend_ax.set_axis_off()
        legend_ax.legend(handles=handles, loc="center", frameon=False)
    else:
        _fitted_legend(fig, handles)
    out.save(fig, path)


def _fitted_legend(fig, handles) -> None:
    """The legend below the axes in as many columns as fit the figure's width (measured, not guessed)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()  # a canvas to measure text with (savefig picks its own)
    for ncols in range(min(len(handles), 4), 0, -1):
        legend = fig.legend(handles=handles, loc="outside lower center", ncols=ncols, frameon=False,
                            columnspacing=1.0, handlelength=2.0)  # fmt: skip
        if ncols == 1 or legend.get_window_extent(renderer).width <= 0.98 * fig.bbox.width:
            return
        legend.remove()


def panel_title(ax, text: str, bold: bool = True, size: float | None = None) -> None:
    """A short left-aligned panel title, its font shrunk (to 7 pt at least) until it fits above its panel.
    Width estimate: a DejaVu Sans character is about 0.62 em wide (0.66 bold); a panel gets its column's
    share of the figure less 0.55 in of tick labels."""
    size = size or RC["axes.titlesize"]
    cols = ax.get_gridspec().ncols if ax.get_gridspec() is not None else 1
    room = (ax.figure.get_figwidth() / cols - 0.55) * 72  # points
    fits = room / ((0.66 if bold else 0.62) * max(1, len(text)))
    ax.set_title(text, loc="left", fontweight="bold" if bold else "normal", fontsize=max(7.0, min(size, fits)))


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


def baselines_of(runs: list[Run]) -> list[float]:
    return sorted({round(b, 6) for r in runs if finite(b := (r.summary or {}).get("baseline_loss"))})


def plot_lr(sweep: dict[str, dict[float, list[Run]]], groups: list[Group], styles: Styles, path: Path,
            out: Output = DEFAULT_OUT) -> None:  # fmt: skip
    """Best val loss against lr, one line per series (the lr is the x axis, so not a line style)."""
    with rc():
        _plot_lr(sweep, groups, styles, path, out)


def rc():
    import matplotlib

    return matplotlib.rc_context(RC)


def _plot_lr(sweep, groups, styles, path, out) -> None:
    fig, axes = _figure(1, 1, width=4.4, height=3.2)
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
    for b in baselines_of([r for by_lr in sweep.values() for runs in by_lr.values() for r in runs]):
        ax.axhline(b, color="0.4", lw=1, linestyle=":")
        extras.add("baseline")
    ax.set(xscale="log", xlabel="peak learning rate (optim.lr)", ylabel=f"best val {LOSS_LABEL}")
    order = [e for e in ("band", "stuck", "diverged", "baseline") if e in extras]
    _finish(fig, styles, order, path, out)
