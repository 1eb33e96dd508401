"""One figure per claim (``claim.png``, ``.pdf``, ``.svg``): for each test, the baseline's and the group's
values side by side (baseline left, group right: the effect is group − baseline), one seed's two runs joined
by a line where the interval pairs them, each side's mean as a bar, and what the test asks drawn where the
group's mean has to land: the band of no meaningful effect (on par) or the threshold line (a difference),
both set off from the baseline's mean. A largest-LR test shows the share of each side's seeds that learned
at each LR of the grid. Axes and sides are named in words; the fonts are the report's at a single column
(7 pt and more at the printed width, :mod:`normbench.report.figures`)."""

from __future__ import annotations

import math
import statistics
import textwrap
from pathlib import Path

METRIC_WORDS = {  # a claim metric in words, for axes and the page (the keys are conf/claims' spellings)
    "best_val_loss": "best validation loss (nats/token)",
    "final_val_loss": "final validation loss (nats/token)",
    "tokens_per_s": "throughput (tokens/s)",
    "var_growth": "variance growth, last block over first",
    "grad_spread": "gradient spread, first block over last",
    "grad_cv": "unevenness of the blocks' gradient norms (CV)",
    "massive_ratio_peak": "peak massive-activation ratio",
    "massive_onset_frac": "first massive activation (fraction of the run)",
    "steps_to_target": "steps to the target loss",
    "tokens_to_target": "tokens to the target loss",
    "seconds_to_target": "seconds to the target loss",
    "skip_cost_deep": "loss increase, a deep block skipped (nats)",
    "learned": "learned (1) or not (0)",
    "attn_logit_peak": "peak attention logit",
    "attn_logit_peak_tau": "peak attention logit / tau",
}
NAMES = {  # arch and norm values as the papers write them
    "pre_ln": "Pre-LN",
    "post_ln": "Post-LN",
    "peri_ln": "Peri-LN",
    "mix_ln": "Mix-LN",
    "hybridnorm": "HybridNorm",
    "hybridnorm_star": "HybridNorm*",
    "deepnorm": "DeepNorm",
    "ngpt": "nGPT",
    "lns": "LayerNorm Scaling",
    "reordered": "reordered Pre-LN",
    "sandwich": "Sandwich",
    "sandwich_depth": "depth-scaled Sandwich",
    "normformer": "NormFormer",
    "simplenorm": "SimpleNorm",
    "rezero": "ReZero",
    "fixup": "Fixup",
    "tfixup": "T-Fixup",
    "layernorm": "LayerNorm",
    "rmsnorm": "RMSNorm",
    "crmsnorm": "CRMSNorm",
    "dyt": "DyT",
    "derf": "Derf",
    "powernorm": "PowerNorm",
    "scalenorm": "ScaleNorm",
    "seednorm": "SeeDNorm",
    "batchnorm": "BatchNorm",
    "none": "no norm",
    "adamw": "AdamW",
    "sgd": "SGD",
    "lion": "Lion",
    "muon": "Muon",
    "adafactor": "Adafactor",
}
PANEL_WIDTH, MAX_WIDTH = 3.3, 6.8  # inches: one test a single column, more tests up to a double one


def metric_words(metric: str) -> str:
    return METRIC_WORDS.get(metric, metric.replace("_", " "))


def side_name(label: str) -> str:
    """``arch=pre_ln norm=rmsnorm`` -> ``Pre-LN, RMSNorm``; other settings as ``optim.lr 0.01``."""
    parts = []
    for item in label.split():
        key, sep, value = item.partition("=")
        if not sep:
            return label  # "the value 0.25": a fixed baseline is already in words
        parts.append(NAMES.get(value, value) if key in ("arch", "norm", "optim") else f"{key} {value}")
    return ", ".join(parts) or label


def paired_lines(t: dict) -> bool:
    """Whether the test's panel joins each seed's two runs: its interval pairs them (same seeds both sides)."""
    sides = list(t.get("groups", {}).values())
    return t.get("interval") == "paired" and len(sides) == 2 and len(sides[0]["values"]) == len(sides[1]["values"])


def effect_interval(t: dict) -> tuple[float, float, float] | None:
    """(effect, low, high) of the test's 95% interval where it has a finite two-sided one, else None."""
    ci = t.get("ci") or [None, None]
    values = (t.get("effect"), *ci)
    if t["kind"] == "largest_lr" or any(v is None or not math.isfinite(v) for v in values):
        return None
    return values


def caption(result: dict, also: str) -> str:
    """The figure's caption, naming only what its panels draw (:func:`_plot_sides`, :func:`_plot_lr_grid`)."""
    tests = result["tests"]
    parts = ["Each test's values, baseline left and group right, in the report's colours: one point per run"]
    if any(paired_lines(t) for t in tests):
        parts.append("a grey line joining one seed's two runs where the interval pairs them")
    parts.append("black bars the means (geometric for a ratio)")
    if any(effect_interval(t) for t in tests):
        parts.append(
            "at the right, the effect (group − baseline) with its 95% interval over seeds, drawn from the "
            "baseline's mean: the interval that decides the test"
        )
    if any(t["kind"] == "on_par" for t in tests):
        parts.append("the shaded band is the band of no meaningful effect around the baseline's mean")
    if any(t["kind"] != "on_par" and t.get("threshold") for t in tests):
        parts.append("the dashed red line the threshold the group's mean has to pass")
    if any(t["kind"] == "largest_lr" for t in tests):
        parts.append("an LR-grid test shows the share of each side's seeds that learned at each LR")
    return f"{'; '.join(parts)} (also {also})."


def plot_claim(result: dict, runs, claim, path: Path) -> Path:
    """The claim's figure at ``path`` (PNG) with PDF and SVG copies beside it."""
    from matplotlib.figure import Figure  # deferred (start-up time): matplotlib

    from normbench.report.figures import SINGLE, grid, rc, set_log  # deferred (start-up time): torch, hydra, omegaconf

    tests = result["tests"]
    colors = side_colors(runs)
    width = min(MAX_WIDTH, PANEL_WIDTH * len(tests))
    rows, cols, _ = grid(len(tests), width, min_panel=2.2, max_cols=3)
    with rc(SINGLE):  # a single column's fonts (7-8 pt) at any width: the panels are a column wide or less
        fig = Figure(figsize=(width, 2.9 * rows + 0.5), layout="constrained")
        axes = [a for row in fig.subplots(rows, cols, squeeze=False) for a in row]
        declared = {t.name: t for t in getattr(claim, "tests", [])}
        for ax, t in zip(axes, tests):
            if t["kind"] == "largest_lr" and t.get("learned_share"):
                _plot_lr_grid(ax, t, set_log)
            else:
                _plot_sides(ax, t, declared.get(t["name"]), set_log, colors)
            chars = (width / cols * 72 - 24) / (0.6 * 8)  # a panel's width in 8 pt characters
            ax.set_title(_wrap(f"{t['name']}: {t['verdict']}", chars), fontsize=8, loc="left")
        for ax in axes[len(tests) :]:
            ax.set_axis_off()
        return save_figure(
            fig,
            path,
            f"{result['claim']} ({result['scale']}): {result['verdict']}",
            formats=("png", "pdf", "svg"),
            dpi=200,
        )


def _wrap(text: str, chars: float) -> str:

    return textwrap.fill(text, width=max(20, int(chars)))


def side_colors(runs) -> dict:
    """{setting: colour} as the report colours its groups (report.figures.Styles over the claim's runs), so a
    side has one colour on the claim's figure and in the report below it."""
    from normbench.analysis.loading import group_runs  # deferred (start-up time): hydra, omegaconf, numpy
    from normbench.report.figures import Styles  # deferred (start-up time): torch, hydra, omegaconf

    groups = group_runs(list(runs)) if runs else []
    if not groups:
        return {}
    styles = Styles(groups)
    return {f"{styles.color_key}={v}": c for v, c in styles.colors.items()}


def _color(label: str, colors: dict, default: str) -> str:
    return next((colors[item] for item in label.split() if item in colors), default)


def _plot_sides(ax, t: dict, test, set_log, colors: dict | None = None) -> None:
    """Baseline (left) and group (right): the values, seeds joined where paired, means, the effect's interval
    and the rule (band or threshold)."""
    labels = list(t["groups"])[::-1]  # baseline first: read left to right, group − baseline
    sides = [t["groups"][g] for g in labels]
    log = t.get("transform") == "log"
    if paired_lines(t):
        for b, g in zip(sides[0]["values"], sides[1]["values"]):
            ax.plot([0, 1], [b, g], color="0.6", lw=0.8, zorder=1)
    for i, side in enumerate(sides):
        vals = [v for v in side["values"] if v is not None]
        default = ("tab:gray", "tab:blue")[i] if len(sides) == 2 else "tab:blue"
        ax.scatter([i] * len(vals), vals, s=16, color=_color(labels[i], colors or {}, default), zorder=2)
        if (m := _mean(vals, log)) is not None:
            ax.hlines(m, i - 0.22, i + 0.22, color="k", lw=1.5, zorder=3)
        bad = {k: n for k, n in side["outcomes"].items() if k not in ("learned", "unstable")}
        if bad:
            ax.annotate(
                ", ".join(f"{n} {k}" for k, n in bad.items()),
                (i, 0),
                xycoords=("data", "axes fraction"),
                ha="center",
                va="bottom",
                fontsize=7,
                color="crimson",
            )
    _draw_interval(ax, t, test, sides, log)
    _draw_rule(ax, t, test, sides, log)
    tuned = t.get("tuned") or {}  # each side at its own best value: name it under the side
    # one setting a line: two long names side by side ran into each other under a narrow panel
    names = [
        side_name(g).replace(", ", ",\n")
        + (f"\n{tuned['key']} {tuned['chosen'][g]}" if tuned.get("chosen", {}).get(g) else "")
        for g in labels
    ]
    if len(labels) == 2:
        names[0] += "\n(baseline)"
    ax.set_xticks(range(len(labels)), names)
    ax.set_xlim(-0.6, len(labels) - 0.4 + (0.35 if effect_interval(t) else 0))
    ax.set_ylabel(metric_words(t["metric"]))
    values = [v for s in sides for v in s["values"] if v is not None]
    if (log or t["metric"].startswith(("var_growth", "grad_spread", "massive"))) and values and min(values) > 0:
        set_log(ax)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", frameon=False, fontsize=7)


def _mean(vals: list[float], log: bool) -> float | None:
    """The mean the test compares: geometric under a log transform (the mean of the logs)."""
    if not vals or (log and min(vals) <= 0):
        return None
    return math.exp(statistics.fmean(math.log(v) for v in vals)) if log else statistics.fmean(vals)


def _reference(test, sides: list[dict], log: bool) -> float | None:
    """The value the effect is set off from: the fixed baseline, or the baseline side's mean."""
    fixed = getattr(test, "baseline", None) if len(sides) == 1 else None
    if isinstance(fixed, (int, float)):
        return fixed
    return _mean(sides[0]["values"], log) if len(sides) == 2 else None


def _shift(ref: float, log: bool):
    """An effect (a difference, or a log ratio) as the value it puts the group at, from ``ref``."""
    return (lambda d: ref * math.exp(d)) if log else (lambda d: ref + d)


def _draw_interval(ax, t: dict, test, sides: list[dict], log: bool) -> None:
    """The effect and its 95% interval, drawn from the reference right of the group: what decides the test,
    next to the band or threshold it is held against."""
    ref, drawn = _reference(test, sides, log), effect_interval(t)
    if ref is None or drawn is None:
        return
    shift = _shift(ref, log)
    effect, lo, hi = (shift(v) for v in drawn)
    x = len(sides) - 1 + 0.35
    ax.errorbar(
        [x],
        [effect],
        yerr=[[max(effect - lo, 0.0)], [max(hi - effect, 0.0)]],  # a zero-width interval: exp() may round it below 0
        fmt="D",
        ms=4,
        color="k",
        capsize=3,
        lw=1.2,
        zorder=4,
        label=f"effect, 95% CI ({t.get('interval') or 'interval'})",
    )


def _draw_rule(ax, t: dict, test, sides: list[dict], log: bool) -> None:
    """Where the group's mean has to be, set off from the baseline's: the band (on par) or the threshold line
    in the claimed direction (a difference or an outcome); a fixed baseline is a line of its own. The band
    does not widen the axis (it would cover it and make an undecided test look on par); the data, the
    interval and the threshold set the limits."""
    fixed = getattr(test, "baseline", None) if len(sides) == 1 else None
    ref = _reference(test, sides, log)
    if ref is None or t.get("threshold") is None:
        return
    shift = _shift(ref, log)
    if isinstance(fixed, (int, float)):
        ax.axhline(ref, color="0.4", lw=1, ls=":", label=f"baseline {ref:g}")
    if t["kind"] == "on_par":
        lo, hi = t["threshold"]
        ax.autoscale_view()
        limits = ax.get_ylim()
        ax.axhspan(shift(lo), shift(hi), color="0.5", alpha=0.18, lw=0, label="band of no meaningful effect")
        ax.set_ylim(limits)
    elif t["threshold"]:
        sign = 1 if t.get("direction") == "higher" else -1
        ax.axhline(shift(sign * t["threshold"]), color="tab:red", lw=1, ls="--", label="threshold")


def save_figure(fig, path: Path, title: str, formats=("png",), dpi: int = 110) -> Path:
    """Title, tight layout, the figure saved as ``path`` (PNG) and in ``formats`` beside it; the figure is
    closed. The title is wrapped to the figure's width."""

    import matplotlib.pyplot as plt  # deferred (start-up time): matplotlib

    fig.suptitle(textwrap.fill(title, width=max(40, int(fig.get_figwidth() * 12))), fontsize=9)
    if fig.get_layout_engine() is None:
        fig.tight_layout()
    for ext in dict.fromkeys(("png", *formats)):
        fig.savefig(path.with_suffix(f".{ext}"), dpi=dpi)
    plt.close(fig)
    return path


def _plot_lr_grid(ax, t: dict, set_log) -> None:
    """Share of each group's seeds with outcome ``learned`` per LR (the largest-LR rule, as
    :func:`.measure.judge_test` counted it), log x; the dashed line marks the group's largest LR at
    which every seed learned."""
    for i, (label, share) in enumerate(reversed(t["learned_share"].items())):  # baseline first, as elsewhere
        grid = sorted(share)
        name = side_name(label) + (" (baseline)" if i == 0 and len(t["learned_share"]) == 2 else "")
        line = ax.plot(grid, [share[lr] for lr in grid], marker="o", label=name)[0]
        if (best := t["largest_lr"].get(label)) is not None:
            ax.axvline(best, ls="--", color=line.get_color(), alpha=0.6)
    set_log(ax, "x")
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("peak learning rate")
    ax.set_ylabel("share of seeds that learned")
    ax.legend(frameon=False, fontsize=7)
