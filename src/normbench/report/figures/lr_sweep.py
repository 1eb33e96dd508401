"""The learning-rate sweep's figure: best validation loss against the peak learning rate, one line per
series, seeds as a min-max band, stuck runs and divergence marked where they happened."""

from __future__ import annotations

import statistics
from pathlib import Path

from normbench.analysis.loading import Group, Run, is_lr_key
from normbench.analysis.stats import LEARNED, learned_everywhere
from normbench.report.figures import (
    DEFAULT_OUT,
    LOSS_LABEL,
    Output,
    Styles,
    finish_figure,
    new_figure,
    rc,
    set_log,
)
from normbench.report.figures.lines import END, baselines_of


def plot_lr(
    sweep: dict[str, dict[float, list[Run]]], groups: list[Group], styles: Styles, path: Path, out: Output = DEFAULT_OUT
) -> None:
    """Best val loss against lr, one line per series (the lr is the x axis, so not a line style)."""
    with rc(out.width):
        _draw(sweep, groups, styles, path, out)


def _draw(sweep, groups, styles, path, out) -> None:
    width = min(out.width, 4.4)  # one panel: no wider than it needs, fonts as at the printed width
    fig, (ax,), _ = new_figure(1, width, height=min(3.2, 0.75 * width))
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
    set_log(ax, "x")
    ax.set(xlabel="peak learning rate (optim.lr)", ylabel=f"best val {LOSS_LABEL}")
    order = [e for e in ("band", "stuck", "diverged", "baseline") if e in extras]
    finish_figure(fig, styles, order, path, out)
