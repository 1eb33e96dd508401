"""How one curve is drawn in every figure: a group's mean with its min-max band, one run's own thin line
(``report --runs``), and a stuck, diverged or failed run on its own, ending in its kind's marker."""

from __future__ import annotations

from normbench.analysis.loading import Run
from normbench.diag.outcomes import finite


def run_kind(run: Run) -> str:
    """How a run not in the mean line is drawn."""
    if run.status == "diverged":
        return "diverged"
    if run.outcome == "stuck":
        return "stuck"
    return "failed"


END = {
    "diverged": {"marker": "x", "ms": 8, "mew": 2},
    "stuck": {"marker": "s", "ms": 6, "mfc": "none"},
    "failed": {"marker": "|", "ms": 10, "mew": 1.5},
}


def single_line(ax, xs, ys, style: dict, kind: str, along: bool = False, top: float | None = None) -> None:
    """One stuck/diverged/failed run: thin, with its kind's marker at the end (or at every point);
    an end above ``top`` (the axes' upper limit) is marked on the top edge."""
    ax.plot(xs, ys, color=style["color"], linestyle=style["linestyle"], lw=0.9, alpha=0.6)
    pts = (xs, ys) if along else (xs[-1:], [min(ys[-1], top) if top is not None else ys[-1]])
    (end,) = ax.plot(*pts, linestyle="none", color=style["color"], clip_on=top is not None, **END[kind])
    end.set_in_layout(False)  # a marker on the top edge must not push the axes around


RUN_LW, RUN_ALPHA = 0.7, 0.55  # report --runs: each run's own line, thin and light under its group's mean


def own_line(ax, run: Run, xs, ys, style: dict) -> None:
    """One run's own curve (``report --runs``), in its group's colour and line style; its gid names the run
    (``run:<name>``, also the element's id in an SVG)."""
    ax.plot(
        xs, ys, color=style["color"], linestyle=style["linestyle"], lw=RUN_LW, alpha=RUN_ALPHA, gid=f"run:{run.name}"
    )


def mean_band(ax, xs, mean, lo, hi, style: dict, n: int, marker=None) -> None:
    ax.plot(
        xs,
        mean,
        color=style["color"],
        linestyle=style["linestyle"],
        lw=1.6,
        marker=marker or style["marker"],
        ms=3.5,
        markevery=None if marker else 0.1,
    )
    if n > 1:
        ax.fill_between(xs, lo, hi, color=style["color"], alpha=0.15, lw=0)


def baselines_of(runs: list[Run]) -> list[float]:
    return sorted({round(b, 6) for r in runs if finite(b := (r.summary or {}).get("baseline_loss"))})
