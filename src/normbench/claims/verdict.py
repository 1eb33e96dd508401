"""The verdict rule (docs/claims.md), on plain numbers so it can be tested on made-up values.

Every test of a claim ends in ``HOLDS``, ``DOES NOT HOLD`` or ``INCONCLUSIVE`` (with a reason):

- ``difference``: effect = mean(group) - mean(baseline) of the metric (after the claim's
  transform, e.g. log for ratios), a 95% t-interval over seeds: paired (over the per-seed
  differences) when both sides ran the same seeds, which share data order and val batches, else
  Welch's. With s the effect signed so that the claimed direction is positive: HOLDS when s > 0, the interval excludes
  zero and s >= threshold; DOES NOT HOLD when the interval lies wholly below zero or wholly
  inside the band of no meaningful effect (-threshold, threshold); else INCONCLUSIVE.
  A baseline given as a number is a one-sample t-interval.
- ``on_par``: HOLDS when the interval lies wholly inside the equivalence band, DOES NOT HOLD
  when wholly outside it, else INCONCLUSIVE.
- ``outcome``: effect = fraction of group runs that learned - the baseline's, with Newcombe's
  hybrid score interval (method 10, Newcombe 1998); then as ``difference``.
- ``largest_lr``: effect = grid steps between the largest LRs at which every seed learned; a
  grid statistic, no interval: HOLDS when effect >= threshold, DOES NOT HOLD when <= 0, and
  INCONCLUSIVE when both groups learn at the top of the grid (the grid is too narrow) or a group
  learns with every seed at no LR of the grid (below the grid, or not learning at all: no telling).

Before any of that: fewer than ``min_seeds`` values on a side, runs that did not finish, or
(for the loss and statistic kinds) runs that got stuck or diverged make the test INCONCLUSIVE,
naming them. A claim with several tests HOLDS when all hold, DOES NOT HOLD when any does not.
"""

from __future__ import annotations

import math

from normbench.analysis.stats import interval, one_sample_interval  # noqa: F401 - the interval rule, shared with report

HOLDS, FAILS, INCONCLUSIVE = "HOLDS", "DOES NOT HOLD", "INCONCLUSIVE"
MIN_SEEDS = 3
Z95 = 1.959963984540054


def _result(verdict: str, effect, ci, reason: str | None = None) -> dict:
    return {"verdict": verdict, "effect": effect, "ci": ci, "reason": reason}


def _seeds_reason(n: int, n_base: int | None, min_seeds: int, problems=()) -> str | None:
    """Why the test cannot have a verdict yet (too few values, named runs), or None."""
    low = [x for x in (n, n_base) if x is not None and x < min_seeds]
    why = [f"too few seeds: {min(low)} values on a side, {min_seeds} needed"] if low else []
    return "; ".join(why + list(problems)) or None


def _signed_rule(effect: float, ci: list[float], direction: str, threshold: float) -> tuple[str, str | None]:
    sign = 1 if direction == "higher" else -1
    s, lo, hi = sign * effect, *sorted((sign * ci[0], sign * ci[1]))
    if s > 0 and lo > 0 and s >= threshold:
        return HOLDS, None
    if hi < 0:
        return FAILS, "the interval lies wholly on the other side of zero"
    if -threshold < lo and hi < threshold:
        return FAILS, f"the interval lies wholly inside the band of no meaningful effect (±{threshold:g})"
    if lo > 0:
        return INCONCLUSIVE, f"effect of the claimed sign but below the threshold {threshold:g}; interval too wide"
    return INCONCLUSIVE, "interval too wide: it includes zero and reaches past the threshold"


def judge_difference(
    xs, base, direction: str, threshold: float, min_seeds: int = MIN_SEEDS, problems=(), paired: bool = False
) -> dict:
    """``xs`` (and ``base``, or a number) are the per-seed values; ``problems`` lists runs that make
    the test inconclusive (stuck, diverged, unfinished); ``paired``: see :func:`interval`."""
    n_base = None if isinstance(base, (int, float)) else len(base)
    effect, ci = interval(xs, base, paired) if xs and (n_base is None or base) else (None, [None, None])
    if why := _seeds_reason(len(xs), n_base, min_seeds, problems):
        return _result(INCONCLUSIVE, effect, ci, why)
    verdict, why = _signed_rule(effect, ci, direction, threshold)
    return _result(verdict, effect, ci, why)


def judge_on_par(xs, base, band: list[float], min_seeds: int = MIN_SEEDS, problems=(), paired: bool = False) -> dict:
    effect, ci = interval(xs, base, paired) if xs and base else (None, [None, None])
    if why := _seeds_reason(len(xs), len(base), min_seeds, problems):
        return _result(INCONCLUSIVE, effect, ci, why)
    lo, hi = ci
    if band[0] < lo and hi < band[1]:
        return _result(HOLDS, effect, ci)
    if hi < band[0] or lo > band[1]:
        return _result(FAILS, effect, ci, f"the interval lies wholly outside the band [{band[0]:g}, {band[1]:g}]")
    return _result(INCONCLUSIVE, effect, ci, f"interval too wide for the band [{band[0]:g}, {band[1]:g}]")


def _wilson(k: int, n: int) -> tuple[float, float]:
    p, z2 = k / n, Z95 * Z95
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def newcombe_interval(k1: int, n1: int, k2: int, n2: int) -> tuple[float, list[float]]:
    """k1/n1 - k2/n2 with Newcombe's hybrid score interval (Newcombe 1998, method 10)."""
    p1, p2 = k1 / n1, k2 / n2
    (l1, u1), (l2, u2) = _wilson(k1, n1), _wilson(k2, n2)
    d = p1 - p2
    return d, [d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2), d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)]


def judge_outcome(
    k, n, k_base, n_base, direction: str, threshold: float, min_seeds: int = MIN_SEEDS, problems=()
) -> dict:
    """``k`` of ``n`` group runs learned, ``k_base`` of ``n_base`` baseline runs."""
    effect, ci = newcombe_interval(k, n, k_base, n_base) if n and n_base else (None, [None, None])
    if why := _seeds_reason(n, n_base, min_seeds, problems):
        return _result(INCONCLUSIVE, effect, ci, why)
    verdict, why = _signed_rule(effect, ci, direction, threshold)
    return _result(verdict, effect, ci, why)


def judge_largest_lr(
    lr,
    lr_base,
    grid: list[float],
    threshold: float = 1,
    n_seeds: int = 0,
    n_base: int = 0,
    min_seeds: int = MIN_SEEDS,
    problems=(),
    direction: str = "higher",
) -> dict:
    """``lr``/``lr_base``: the largest grid LR at which every seed learned (None: none did, i.e.
    below the grid). Effect: grid steps from the baseline's to the group's."""
    grid = sorted(grid)
    pos = lambda x: -1 if x is None else grid.index(x)
    effect = pos(lr) - pos(lr_base) if grid else None
    if why := _seeds_reason(n_seeds, n_base, min_seeds, problems):
        return _result(INCONCLUSIVE, effect, None, why)
    if lr is None and lr_base is None:
        return _result(INCONCLUSIVE, effect, None, "no LR of the grid learned with every seed in either group")
    if lr is None or lr_base is None:  # below the grid, or not learning at this scale at all: no way to tell
        side = "the group" if lr is None else "the baseline"
        return _result(
            INCONCLUSIVE,
            effect,
            None,
            f"no LR of the grid learned with every seed in {side}: its largest "
            "learning LR is not on the grid (widen the grid downward, or train longer)",
        )
    if lr == lr_base == grid[-1]:
        return _result(INCONCLUSIVE, effect, None, "both learn at the largest LR of the grid; widen the grid")
    s = effect if direction == "higher" else -effect
    if s >= threshold:
        return _result(HOLDS, effect, None)
    if s <= 0:
        return _result(FAILS, effect, None, "the largest learning LRs are equal or ordered against the claim")
    return _result(INCONCLUSIVE, effect, None, f"moved by fewer than {threshold:g} grid steps")


def combine(verdicts: list[str]) -> str:
    if verdicts and all(v == HOLDS for v in verdicts):
        return HOLDS
    if any(v == FAILS for v in verdicts):
        return FAILS
    return INCONCLUSIVE
