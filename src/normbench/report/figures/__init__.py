"""The report's figures: shared conventions and saving (matplotlib, no pyplot: no global state, no GUI
backend). Loss, LR/grad-norm and depth figures: :mod:`.curves`; heatmaps and per-layer statistics:
:mod:`.layers`; the learning-rate sweep: :mod:`.lr_sweep`.

Conventions, the same in every figure: one colour per value of one factor (``arch`` when it
varies: a fixed colour per architecture) and one line style per value of a second (``norm``
when it varies), with a point marker per line style too (so overlapping lines stay apart), further
factors by marker, each listed in the legend in the order the sweep ran its values; one shared
legend below the axes; seeds drawn as the mean line with a min-max band (``report --runs``: in the
loss and LR/grad-norm curves, each run's own thin line instead of the band). Blocks are numbered 1..L
everywhere; a depth position l is the residual stream after block l (0: the embedding output). An axis
is logarithmic when its own values span more than 30x. Stuck and diverged runs are never dropped: each
is drawn on its own, thin, ending in a hollow square (stuck) or an x at the step it stopped (diverged).

Sizes are set for print at the width the figure will have in the paper (``Output.width``, ``report
--width``: 3.3 in for a single column, 6.8 in for a double one, the default): the font sizes follow
from the width (:func:`rc_for`: 7 pt tick labels at 3.3 in up to 9 pt at 6.8 in, labels and titles
1 pt larger), so no text is under 7 pt at the printed size; panels are laid out in as many columns as
fit :data:`MIN_PANEL` inches each, and no figure is taller than a page (:data:`MAX_HEIGHT`,
:func:`fit_page`: more, narrower columns first, then shorter rows). Panel titles are short; what a
figure shows is its caption in the report. ``Output`` saves each figure as PNG (the report embeds that)
and in any of PDF and SVG, at ``dpi``.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

from normbench.analysis.loading import Group, setting
from normbench.diag.outcomes import MASSIVE_THRESHOLD, finite
from normbench.model import norm_class
from normbench.report.figures.layout import fit_page
from normbench.report.figures.lines import RUN_ALPHA, RUN_LW

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
PALETTE = (
    "tab:blue",
    "tab:orange",
    "tab:green",
    "tab:red",
    "tab:purple",
    "tab:brown",
    "tab:pink",
    "tab:olive",
    "tab:cyan",
    "tab:gray",
)
LINE_STYLES = ("-", "--", ":", "-.", (0, (5, 1, 1, 1)), (0, (1, 3)))
MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*")
POINT_MARKERS = ("o", "s", "^", "D", "v", "P")
LOSS_LABEL = "loss (nats/token)"
STEP_LABEL = "training step"
X_AXES = {  # report --x: the x axis of the curves logged at every log step -> (metrics.jsonl key, axis label)
    "step": ("step", STEP_LABEL),
    "tokens": ("tokens", "training tokens"),
    "time": ("time_s", "wall-clock seconds since the start"),
}
FORMATS = ("png", "pdf")
ALL_FORMATS = ("png", "pdf", "svg")
DPI = 200
SINGLE, DOUBLE = 3.3, 6.8  # inches: a paper's single and double column
WIDTH = DOUBLE  # the default width; see the module docstring
WIDTH_RANGE = (2.0, 12.0)
MIN_PT = 7.0  # no text smaller, at the printed width
MIN_PANEL = 1.6  # inches: the narrowest panel a grid of panels gets
LOG_SPAN = 30  # an axis whose positive values span more than this factor is logarithmic
RC = {"axes.spines.top": False, "axes.spines.right": False, "pdf.fonttype": 42, "svg.fonttype": "none"}


def rc_for(width: float) -> dict:
    """Font sizes and line widths for a figure ``width`` inches wide, as printed: tick labels and legend
    7 pt at a single column (3.3 in) rising to 9 pt at a double one (6.8 in), labels and titles 1 pt more."""
    t = min(1.0, max(0.0, (width - SINGLE) / (DOUBLE - SINGLE)))
    small, big = MIN_PT + 2.0 * t, MIN_PT + 1.0 + 2.0 * t
    return {
        **RC,
        "font.size": big,
        "axes.titlesize": big,
        "axes.labelsize": big,
        "xtick.labelsize": small,
        "ytick.labelsize": small,
        "legend.fontsize": small,
        "lines.linewidth": 1.2 + 0.4 * t,
    }


def font_pt(name: str = "xtick.labelsize") -> float:
    """An rc font size in points (inside :func:`rc`: the sizes :func:`rc_for` set)."""
    import matplotlib  # deferred (start-up time): matplotlib
    from matplotlib.font_manager import FontProperties  # deferred (start-up time): matplotlib

    return FontProperties(size=matplotlib.rcParams[name]).get_size_in_points()


def grid(n: int, width: float, min_panel: float = MIN_PANEL, max_cols: int = 4) -> tuple[int, int, float]:
    """(rows, columns, row height in inches) for ``n`` panels in a figure ``width`` inches wide: as many
    columns (up to ``max_cols``) as give each panel ``min_panel`` inches, a row about 0.8 of a panel's width."""
    ncols = max(1, min(n, max_cols, int(width // min_panel)))
    nrows = -(-n // ncols)
    return nrows, ncols, min(2.6, max(1.6, 0.8 * width / ncols + 0.3))


@dataclass(frozen=True)
class Output:
    """How figures are saved: PNG always (the report embeds it), plus the other ``formats``, at ``dpi``."""

    formats: tuple[str, ...] = FORMATS
    dpi: int = DPI
    width: float = WIDTH  # inches, as printed

    def save(self, fig, path: Path) -> None:
        for ext in dict.fromkeys(("png", *self.formats)):
            fig.savefig(path.with_suffix(f".{ext}"), dpi=self.dpi)


DEFAULT_OUT = Output()


def is_wide(values) -> bool:
    """Whether the positive values span more than :data:`LOG_SPAN` (their axis is then logarithmic)."""
    pos = [v for v in values if finite(v) and v > 0]
    return bool(pos) and max(pos) / min(pos) > LOG_SPAN


def set_log(ax, which: str = "y", scale: bool = True) -> None:
    """A logarithmic axis with plain tick labels (``100``, ``600``, ``0.01``): the default's superscripts
    (``6×10²``) are set at 70% of the tick size, under :data:`MIN_PT` at a single column. ``scale=False``:
    the labels only, on an axis already logarithmic (a colour bar's)."""
    from matplotlib.ticker import LogFormatter  # deferred (start-up time): matplotlib

    class Plain(LogFormatter):  # which ticks get a label: LogFormatter's choice; the label: the number
        def _num_to_string(self, x, vmin, vmax):
            return f"{x:g}"

    axis = ax.yaxis if which == "y" else ax.xaxis
    if scale:
        getattr(ax, f"set_{which}scale")("log", nonpositive="mask")
    axis.set_major_formatter(Plain())
    axis.set_minor_formatter(Plain(labelOnlyBase=False))


def log_if_wide(ax, values) -> None:
    if is_wide(values):
        set_log(ax)


def setup_caption(groups: list[Group]) -> str:
    """One sentence with what every figure shares: the runs, the model, steps and the seeds per line."""
    runs = [r for g in groups for r in g.runs]
    first = runs[0]
    model = setting(first, "model")
    size = ", ".join(
        f"{v} {k}"
        for k, v in (("blocks", setting(first, "model.n_layer")), ("wide", setting(first, "model.d_model")))
        if v
    )
    steps = {s for r in runs if (s := setting(r, "trainer.max_steps"))}
    n_seeds = max((len(g.runs) for g in groups), default=1)
    parts = [f"{len(runs)} runs in {len(groups)} groups"]
    parts += [f"model {model}" + (f" ({size})" if size else "")] if model else []
    parts += [f"{next(iter(steps))} steps" if len(steps) == 1 else "steps differ between runs"] if steps else []
    parts.append(
        f"a line is the mean of up to {n_seeds} seeds, the band their min–max" if n_seeds > 1 else "one run per line"
    )
    return "; ".join(parts) + "."


def norm_styles(norms: list[str]) -> dict[str, object]:
    """Each norm's line style: the one its class declares (``line_style``, norm/norm_api.py), else one of
    :data:`LINE_STYLES` that no declared norm in the figure has, so a new norm never shares LayerNorm's."""
    declared = {v: style for v in norms if (style := norm_class(v).line_style) is not None}
    free = [s for s in LINE_STYLES if s not in declared.values()] or list(LINE_STYLES)
    undeclared = [v for v in norms if v not in declared]
    return {v: declared.get(v) or free[undeclared.index(v) % len(free)] for v in norms}


def sweep_order(groups: list[Group], value) -> list:
    """The distinct values ``value(group)`` takes, in the order the sweep ran them (the groups' order)."""
    return list(dict.fromkeys(value(g) for g in groups))


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
        value = lambda g, k: g.settings.get(k) or setting(g.runs[0], k) or "?"
        self.value = value
        cvals = sweep_order(groups, lambda g: value(g, self.color_key))  # the legend's order: the sweep's
        others = [v for v in cvals if not (self.color_key == "arch" and v in ARCH_COLORS)]
        self.colors = {
            v: ARCH_COLORS[v] if self.color_key == "arch" and v in ARCH_COLORS else PALETTE[others.index(v) % 10]
            for v in cvals
        }
        svals = sweep_order(groups, lambda g: value(g, self.style_key)) if self.style_key else []
        self.linestyles = (
            norm_styles(svals)
            if self.style_key == "norm"
            else {v: LINE_STYLES[i % len(LINE_STYLES)] for i, v in enumerate(svals)}
        )
        mvals = sweep_order(groups, lambda g: tuple(value(g, k) for k in self.marker_keys)) if self.marker_keys else []
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
        from matplotlib.lines import Line2D  # deferred (start-up time): matplotlib
        from matplotlib.patches import Patch  # deferred (start-up time): matplotlib

        h = [Line2D([], [], color=c, lw=2.5, label=f"{self.color_key} = {v}") for v, c in self.colors.items()]
        if self.style_key and len(self.linestyles) > 1:
            h += [
                Line2D(
                    [],
                    [],
                    color="0.3",
                    linestyle=ls,
                    lw=1.5,
                    marker=self.points[v],
                    ms=4,
                    label=f"{self.style_key} = {v}",
                )
                for v, ls in self.linestyles.items()
            ]
        if len(self.markers) > 1:
            h += [
                Line2D(
                    [],
                    [],
                    color="0.3",
                    marker=m,
                    linestyle="none",
                    label=", ".join(f"{k} = {x}" for k, x in zip(self.marker_keys, v)),
                )
                for v, m in self.markers.items()
            ]
        extra = {
            "band": Patch(color="0.6", alpha=0.3, label="seeds: min–max"),
            "runs": Line2D([], [], color="0.3", lw=RUN_LW, alpha=RUN_ALPHA, label="one run (thick: the mean)"),
            "clip": Line2D([], [], color="0.4", lw=1, linestyle=":", label="clip threshold (trainer.grad_clip)"),
            "stuck": Line2D([], [], color="0.3", lw=0.9, marker="s", mfc="none", label="stuck run"),
            "diverged": Line2D([], [], color="0.3", lw=0.9, marker="x", mew=2, label="diverged run (× stop)"),
            "failed": Line2D([], [], color="0.3", lw=0.9, marker="|", ms=9, label="unfinished run"),
            "baseline": Line2D([], [], color="0.4", lw=1, linestyle=":", label="no-context baseline"),
            "threshold": Line2D(
                [], [], color="0.4", lw=1, linestyle=":", label=f"massive threshold ({MASSIVE_THRESHOLD:g})"
            ),
        }
        return h + [extra[e] for e in extras]


def new_figure(n: int, width: float, max_cols: int = 4, spare_legend: bool = True, height: float | None = None):
    """A figure ``width`` inches wide with ``n`` panels in a :func:`grid` of at most ``max_cols`` columns,
    ``height`` per row (default: the grid's). Returns (figure, the n axes, the legend's axes): a slot the
    panels leave empty holds the legend when ``spare_legend``; else (None) the legend goes below, with room
    added for it. Other empty slots are switched off."""
    from matplotlib.figure import Figure  # deferred (start-up time): matplotlib

    rows, cols, h = grid(n, width, max_cols=max_cols)
    below = lambda r, c: 0.0 if spare_legend and r * c > n else 0.7  # the legend's room when no slot is left
    rows, cols, h = fit_page(n, width, rows, cols, height or h, below)
    spare = spare_legend and rows * cols > n
    fig = Figure(figsize=(width, h * rows + below(rows, cols)), layout="constrained")
    axes = [a for row in fig.subplots(rows, cols, squeeze=False) for a in row]
    for ax in axes[n + spare :]:
        ax.set_axis_off()
    return fig, axes[:n], axes[n] if spare else None


def finish_figure(fig, styles: Styles, extras, path: Path, out: Output, legend_ax=None) -> None:
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
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # deferred (start-up time): matplotlib

    renderer = FigureCanvasAgg(fig).get_renderer()  # a canvas to measure text with (savefig picks its own)
    for ncols in range(min(len(handles), 4), 0, -1):
        legend = fig.legend(
            handles=handles, loc="outside lower center", ncols=ncols, frameon=False, columnspacing=1.0, handlelength=2.0
        )
        if ncols == 1 or legend.get_window_extent(renderer).width <= 0.98 * fig.bbox.width:
            return
        legend.remove()


def panel_title(ax, text: str, bold: bool = True, size: float | None = None) -> None:
    """A short left-aligned panel title, its font shrunk (to :data:`MIN_PT` at least) until it fits above
    its panel, and wrapped onto a second line where even that does not fit. Width estimate: a DejaVu Sans
    character is about 0.62 em wide (0.66 bold); a panel gets its column's share of the figure less 0.45 in
    of tick labels."""

    size = size or font_pt("axes.titlesize")
    cols = ax.get_gridspec().ncols if ax.get_gridspec() is not None else 1
    room = max(0.5, ax.figure.get_figwidth() / cols - 0.45) * 72  # points
    em = 0.66 if bold else 0.62
    size = max(MIN_PT, min(size, room / (em * max(1, len(text)))))
    chars = int(room / (em * size))
    text = textwrap.fill(text, width=max(8, chars)) if len(text) > chars else text
    ax.set_title(text, loc="left", fontweight="bold" if bold else "normal", fontsize=size)


def rc(width: float = WIDTH):
    import matplotlib  # deferred (start-up time): matplotlib

    return matplotlib.rc_context(rc_for(width))
