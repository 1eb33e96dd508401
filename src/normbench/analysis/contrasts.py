"""Contrasts with the seed as the unit: one value of a factor against another, pooled over the settings of
the other factors (the verdict box's rows, :mod:`.verdicts`).

A sweep ``arch x norm x seed`` gives ``post_ln − pre_ln`` once per (norm, seed). Those differences are not
independent draws: one seed gives every norm the same data order and val batches, and the seed-to-seed
shift is shared, so pooling them as (norms x seeds) pairs counts each seed more than once and the interval
comes out too narrow. Here the seed is the unit. Each *cell* is one setting of the other factors (``norm=
layernorm``) with its group on both sides; per seed, the difference is averaged over the cells, then the
one-sample t-interval of those per-seed differences is taken, with n_seeds − 1 degrees of freedom (paired),
when every cell ran the same seeds on both sides and every run has a value. Otherwise it is Welch's interval
between the two sides' per-seed means (each seed's value averaged over the cells where it has one).

Beside the pooled contrast, the contrast within each cell (the interaction: does the arch effect depend on
the norm?), and :func:`disagreement` says where those disagree. :func:`holm` adjusts the p-values of all the
comparisons a box makes (Holm 1979), so a ranking is only read where it survives them all.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from itertools import combinations, permutations

from normbench.analysis.loading import Group
from normbench.analysis.stats import one_sample_interval, seed_means, seed_order, t_pvalue, welch_df, welch_interval


@dataclass
class Contrast:
    diff: float | None = None  # mean(value) − mean(base), over seeds
    low: float | None = None  # its 95% interval; None with fewer than 2 seeds a side
    high: float | None = None
    p: float | None = None  # two-sided, unadjusted
    how: str = ""  # "paired, 2 seeds x 2 settings" (each seed's difference averaged over 2), "Welch, 3 vs 2 seeds"

    @property
    def separated(self) -> bool:
        return self.low is not None and not (self.low <= 0 <= self.high)


@dataclass
class Cell:
    label: str  # the other factors' settings, e.g. "norm=layernorm" ("" when nothing else varied)
    group: Group
    base: Group


def contrast(cells: list[Cell], get) -> Contrast:
    """``get(run)`` of the cells' groups minus their baselines', the seed as the unit (the module's rule)."""
    sides = [(seed_means(c.group.runs, get), seed_means(c.base.runs, get)) for c in cells]
    complete = all(get(r) is not None for c in cells for r in c.group.runs + c.base.runs)
    seeds = set(sides[0][0]) if sides else set()
    over = f" x {len(cells)} settings" if len(cells) > 1 else ""  # each seed: the mean over the settings
    if complete and len(seeds) >= 2 and all(set(g) == seeds == set(b) for g, b in sides):
        per_seed = [statistics.fmean(g[s] - b[s] for g, b in sides) for s in seed_order(seeds)]
        low, high = one_sample_interval(per_seed)
        diff = statistics.fmean(per_seed)
        return Contrast(
            diff, low, high, t_pvalue(diff, low, high, len(per_seed) - 1), f"paired, {len(per_seed)} seeds{over}"
        )
    xs, bs = _pooled([g for g, _ in sides]), _pooled([b for _, b in sides])
    how = f"Welch, {len(xs)} vs {len(bs)} seeds{over}" if cells else "no setting ran both"
    if not xs or not bs:
        return Contrast(how=how)
    d = welch_interval(xs, bs)
    p = t_pvalue(d.diff, d.low, d.high, welch_df(xs, bs)) if d.low is not None else None
    return Contrast(d.diff, d.low, d.high, p, how)


def _pooled(per_cell: list[dict[str, float]]) -> list[float]:
    """Per seed, the mean over the cells where that seed has a value."""
    seeds = seed_order({s for cell in per_cell for s in cell})
    return [statistics.fmean(cell[s] for cell in per_cell if s in cell) for s in seeds]


def per_cell(cells: list[Cell], get) -> list[tuple[str, Contrast]]:
    """The contrast within each cell (the interaction); [] when there is only one cell."""
    return [(c.label, contrast([c], get)) for c in cells] if len(cells) > 1 else []


def disagreement(per: list[tuple[str, Contrast]]) -> str | None:
    """Where the cells' contrasts disagree, in words: two intervals that do not overlap, or an interval clear
    of zero on one side while another cell's difference has the other sign; None when they agree."""
    shown = [(label, c) for label, c in per if c.low is not None]
    notes = []
    for (la, a), (lb, b) in combinations(shown, 2):
        if a.high < b.low or b.high < a.low:
            notes.append(f"intervals do not overlap ({la} vs {lb})")
            break
    for (la, a), (lb, b) in permutations(shown, 2):
        if (a.low > 0 and b.diff < 0) or (a.high < 0 and b.diff > 0):
            notes.append(f"signs differ ({la} vs {lb})")
            break
    return "; ".join(notes) or None


def holm(ps: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values (Holm 1979), in the order given: the k-th smallest p is multiplied
    by (m − k + 1), and each adjusted value is at least the one before it, capped at 1. scipy has the
    false-discovery adjustments (``scipy.stats.false_discovery_control``) but not this family-wise one."""
    m, adjusted, running = len(ps), [0.0] * len(ps), 0.0
    for rank, i in enumerate(sorted(range(m), key=ps.__getitem__)):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        adjusted[i] = running
    return adjusted
