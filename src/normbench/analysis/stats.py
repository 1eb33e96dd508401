"""Numbers over runs and groups: which runs to average, time to a target loss, per-layer
statistics, and differences from a baseline group with a 95% interval over seeds.

These are the functions a caller builds on (``load_runs -> filter_runs -> group_runs ->``
:func:`group_metric` / :func:`time_to_target` / :func:`compare`); the tables and figures
only format them.

The interval is Welch's t-interval for a difference of two means (unequal variances,
Welch-Satterthwaite degrees of freedom; Welch 1947), over seeds: it needs at least two
runs on each side, and says nothing about effects that seeds do not vary (data order is
seeded too, so it does). :func:`interval` is the rule ``reproduce`` and the report's verdict box
share (docs/claims.md): the seed is the unit (runs that share a seed are averaged first,
:func:`seed_means`), paired over seeds (:func:`seed_pairs`: the one-sample t-interval of the per-seed
differences) when both sides ran the same seeds, else Welch's over the per-seed means.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass

from normbench.analysis import numbers
from normbench.analysis.loading import Group, Run, finite_series, setting
from normbench.diag.outcomes import OUTCOMES, finite, layer_series, layer_stats
from normbench.run.eval_file import downstream_value, split_metric

STATUS_ORDER = ("completed", "diverged", "failed", "interrupted", "stopped", "running")
OUTCOME_ORDER = (*OUTCOMES, "unknown", "interrupted", "stopped", "running", "failed")
UNFINISHED = ("running", "interrupted", "stopped")  # partial losses, resumable (analysis/loading.py: Run.status)
LEARNED = ("learned", "unstable")  # the run beat the no-context baseline
FINISHED = ("completed", "diverged")  # a run that ended by itself
LAYER_KEYS = ("var_growth", "grad_spread", "grad_cv", "massive_ratio_peak", "massive_ratio_step", "logit_maxabs")


def counts(labels: list[str], order: tuple[str, ...]) -> str:
    """ "2 learned, 1 stuck": how many of each, in a fixed order."""
    c = Counter(labels)
    keys = [k for k in order if k in c] + sorted(set(c) - set(order))
    return ", ".join(f"{c[k]} {k}" for k in keys)


def outcome_counts(runs: list[Run]) -> str:
    return counts([r.outcome_label for r in runs], OUTCOME_ORDER)


def status_counts(runs: list[Run]) -> str:
    return counts([r.status for r in runs], STATUS_ORDER)


def loss_pool(group: Group) -> tuple[list[Run], bool]:
    """Runs whose losses are averaged: completed ones (learned, unstable and stuck: all are
    measured losses); if none yet, running/interrupted/stopped ones (marked partial). Diverged losses
    are meaningless and never averaged."""
    done = [r for r in group.runs if r.status == "completed"]
    return done or [r for r in group.runs if r.status in UNFINISHED], not done


def healthy(runs: list[Run]) -> list[Run]:
    """Runs drawn as a group's mean line: completed and not stuck (stuck and diverged runs are
    drawn one by one); if none, the running/interrupted/stopped ones."""
    done = [r for r in runs if r.status == "completed" and r.outcome != "stuck"]
    return done or [r for r in runs if r.status in UNFINISHED]


def mean_std(xs: list[float], fmt: str = ".4f", suffix: str = "") -> str:
    """``mean ± sample std``, both at the std's precision (:mod:`.numbers`); one value: ``fmt``."""
    if not xs:
        return "—"
    m = statistics.fmean(xs)
    return (format(m, fmt) if len(xs) == 1 else numbers.pm(m, statistics.stdev(xs), fmt)) + suffix


# ----------------------------------------------------------------------------- time to target


@dataclass
class Reached:
    steps: float
    tokens: float
    seconds: float


def crossing(points: list[tuple[float, float]], target: float) -> tuple[int, float] | None:
    """Where a piecewise-linear curve through ``points`` ((x, loss), sorted by x) first reaches
    ``loss <= target``: (index i of the first point at or below it, fraction f in [0, 1] of the
    way from point i-1 to point i); None if it never does."""
    for i, (_, v) in enumerate(points):
        if v <= target:
            if i == 0:
                return 0, 1.0
            v0 = points[i - 1][1]
            return i, (v0 - target) / (v0 - v)
    return None


def time_to_target(run: Run, target: float | None) -> Reached | None:
    """Steps, tokens and wall-clock seconds (``time_s``: since the run started, evaluation
    included) at which the run's val loss first reached ``target``, linearly interpolated between
    the two evaluations around the crossing; None if it never did (or has no evaluations)."""
    if target is None:
        return None
    evals = {s: r for r in run.records if finite(r.get("val_loss")) for s in [r["step"]]}  # a later record wins
    pts = [evals[s] for s in sorted(evals)]
    hit = crossing([(r["step"], r["val_loss"]) for r in pts], target)
    if hit is None:
        return None
    i, f = hit
    at = lambda key: (
        float(pts[i].get(key) or 0)
        if i == 0
        else (1 - f) * float(pts[i - 1].get(key) or 0) + f * float(pts[i].get(key) or 0)
    )
    return Reached(at("step"), at("tokens"), at("time_s"))


def eval_spacing(runs: list[Run]) -> float | None:
    """The usual number of steps between two evaluations (the median gap over every run's evaluations
    after the first; the first one, at step 1 or 0, comes early); None with fewer than 3 evaluations."""
    gaps = []
    for r in runs:
        steps = sorted({rec["step"] for rec in r.records if finite(rec.get("val_loss"))})
        gaps += [b - a for a, b in zip(steps[1:], steps[2:])]
    return float(statistics.median(gaps)) if gaps else None


def corpus(run: Run) -> str:
    """The (corpus, tokenizer) a run trained on: losses are only comparable within one."""
    return f"{setting(run, 'data') or '?'}/{setting(run, 'data.tokenizer') or '?'}"


def default_targets(runs: list[Run]) -> dict[str, float]:
    """Per corpus: the largest best val loss among the runs that learned, rounded up to 2
    decimals, i.e. the best loss every learned run reached. No target for a corpus where no
    run learned (give ``--target``)."""
    worst: dict[str, float] = {}
    for r in runs:
        if r.outcome in LEARNED and (best := r.val_losses[1]) is not None:
            worst[corpus(r)] = max(worst.get(corpus(r), -math.inf), best)
    return {c: math.ceil(round(v * 100, 6)) / 100 for c, v in worst.items()}


def target_for(run: Run, target: float | None, defaults: dict[str, float]) -> float | None:
    return target if target is not None else defaults.get(corpus(run))


# ----------------------------------------------------------------------------- per-layer statistics


def run_layer_stats(run: Run) -> dict:
    """The end-of-run per-layer statistics: from summary.json when the trainer wrote them, else
    computed from the run's records (a running or older run)."""
    s = run.summary or {}
    if "layer_series" in s:
        return {k: s.get(k) for k in LAYER_KEYS}
    return {k: v for k, v in layer_stats(layer_series(run.records)).items() if k in LAYER_KEYS}


def run_layer_series(run: Run) -> dict[str, list[list[float]]]:
    s = (run.summary or {}).get("layer_series")
    return s if isinstance(s, dict) and s and run.status not in ("running", "stopped") else layer_series(run.records)


# ----------------------------------------------------------------------------- metrics and comparisons

METRICS = {
    "best val loss": lambda r, t: r.val_losses[1],
    "final val loss": lambda r, t: r.val_losses[0],
    "steps to target": lambda r, t: x.steps if (x := time_to_target(r, t)) else None,
    "seconds to target": lambda r, t: x.seconds if (x := time_to_target(r, t)) else None,
}


def metric_fn(metric: str):
    """``fn(run, target)`` of a metric of :data:`METRICS`, or of a downstream ``TASK/METRIC`` (the run's
    eval.json; run/eval_file.py)."""
    if metric in METRICS:
        return METRICS[metric]
    task, name = split_metric(metric)
    return lambda r, t: downstream_value(r.downstream, task, name)


def group_metric(group: Group, metric: str, target: float | None = None, defaults=None) -> list[float]:
    """The metric's values over the group's completed runs (or partial runs, as :func:`loss_pool`);
    runs without a value (e.g. never reached the target) are left out."""
    pool, _ = loss_pool(group)
    fn = metric_fn(metric)
    return [v for r in pool if finite(v := fn(r, target_for(r, target, defaults or {})))]


@dataclass
class Difference:
    diff: float | None  # mean(group) - mean(baseline)
    low: float | None  # 95% interval; None with fewer than 2 runs on a side
    high: float | None
    n: int
    n_base: int


def welch_interval(xs: list[float], base: list[float], level: float = 0.95) -> Difference:
    """mean(xs) - mean(base) with Welch's t-interval at ``level``."""
    n, m = len(xs), len(base)
    if not n or not m:
        return Difference(None, None, None, n, m)
    d = statistics.fmean(xs) - statistics.fmean(base)
    if n < 2 or m < 2:
        return Difference(d, None, None, n, m)
    se = math.sqrt(statistics.variance(xs) / n + statistics.variance(base) / m)
    if se == 0:
        return Difference(d, d, d, n, m)
    from scipy.stats import t  # deferred (start-up time): scipy

    half = float(t.ppf(0.5 + level / 2, welch_df(xs, base))) * se
    return Difference(d, d - half, d + half, n, m)


def one_sample_interval(xs: list[float], level: float = 0.95) -> tuple[float, float]:
    from scipy.stats import t  # deferred (start-up time): scipy

    m = statistics.fmean(xs)
    se = statistics.stdev(xs) / math.sqrt(len(xs))
    if se == 0:
        return m, m
    half = float(t.ppf(0.5 + level / 2, len(xs) - 1)) * se
    return m - half, m + half


def interval(xs: list[float], base: list[float] | float, paired: bool = False) -> tuple[float, list[float]]:
    """(mean(xs) - mean(base), [low, high]): Welch's interval, or one-sample if ``base`` is a number.

    ``paired``: xs[i] and base[i] share seed i, hence the data order and the val batches (common random
    numbers): the one-sample interval of the per-seed differences, which drops the seed-to-seed variance
    both sides share."""
    if paired:
        lo, hi = one_sample_interval([x - b for x, b in zip(xs, base, strict=True)])
        return statistics.fmean(xs) - statistics.fmean(base), [lo, hi]
    if isinstance(base, (int, float)):
        lo, hi = one_sample_interval(xs)
        return statistics.fmean(xs) - base, [lo - base, hi - base]
    d = welch_interval(xs, base)
    return d.diff, [d.low, d.high]


def seed_key(run: Run) -> str:
    """The unit of every interval over seeds: the run's seed (a run without one is its own unit)."""
    seed = setting(run, "seed")
    return seed if seed is not None else f"run {run.path}"


def seed_means(runs: list[Run], value, transform: str | None = None) -> dict[str, float]:
    """seed -> the mean of ``value`` over the runs with that seed that have one (in the log scale under a log
    transform: a geometric mean). Runs that share a seed share their data order and val batches, so they
    are one unit of evidence, not several: an interval over seeds counts each seed once."""
    by_seed: dict[str, list[float]] = {}
    for r in runs:
        v = value(r)
        if v is not None and not (transform == "log" and v <= 0):
            by_seed.setdefault(seed_key(r), []).append(v)
    mean = statistics.geometric_mean if transform == "log" else statistics.fmean
    return {s: vs[0] if len(vs) == 1 else mean(vs) for s, vs in by_seed.items()}  # one run: its value, exactly


def seed_order(seeds) -> list[str]:
    return sorted(seeds, key=lambda s: (0, float(s), "") if _is_number(s) else (1, 0.0, s))


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def seed_pairs(g_runs: list[Run], b_runs: list[Run], value, transform: str | None) -> list[tuple] | None:
    """[(group value, baseline value)] ordered by seed, when both sides ran the same seeds (two or more), every
    run finished with a value (a log transform: a positive one); else None (Welch's interval then). Runs of
    a side that share a seed are averaged first (:func:`seed_means`): one pair per seed. Same seed, same data
    order and val batches (normbench.data.batches): the pairs share their sampling noise (common random numbers)."""
    sides = []
    for runs in (g_runs, b_runs):
        values = [value(r) if r.status in FINISHED else None for r in runs]
        if not runs or any(v is None or (transform == "log" and v <= 0) for v in values):
            return None
        sides.append(seed_means(runs, value, transform))
    if set(sides[0]) != set(sides[1]) or len(sides[0]) < 2:
        return None
    return [(sides[0][s], sides[1][s]) for s in seed_order(sides[0])]


def t_pvalue(diff: float, low: float | None, high: float | None, df: float, level: float = 0.95) -> float | None:
    """The two-sided p-value of ``diff`` against 0, from its t-interval at ``level`` with ``df`` degrees of
    freedom (the interval's half-width is t * se): what a multiple-comparison adjustment needs."""
    from scipy.stats import t  # deferred (start-up time): scipy

    if low is None or high is None:
        return None
    half = (high - low) / 2
    if half <= 0:  # no spread: a nonzero difference is certain, none is none
        return 0.0 if diff != 0 else 1.0
    se = half / float(t.ppf(0.5 + level / 2, df))
    return float(2 * t.sf(abs(diff) / se, df))


def welch_df(xs: list[float], base: list[float]) -> float:
    """Welch-Satterthwaite degrees of freedom of :func:`welch_interval` (both sides with two values or more)."""
    a, b = statistics.variance(xs) / len(xs), statistics.variance(base) / len(base)
    if a + b == 0:
        return float(len(xs) + len(base) - 2)
    return (a + b) ** 2 / (a * a / (len(xs) - 1) + b * b / (len(base) - 1))


def baseline_of(groups: list[Group], key: str, value: str) -> dict[str, Group | None]:
    """For every group, the group that differs from it only in ``key`` having ``value``."""
    by_settings = {tuple(sorted(g.settings.items())): g for g in groups}
    out = {}
    for g in groups:
        want = tuple(sorted({**g.settings, key: value}.items()))
        out[g.label] = by_settings.get(want)
    return out


def compare(groups: list[Group], key: str, value: str, metric: str, target=None, defaults=None) -> dict:
    """label -> :class:`Difference` of ``metric`` from the group's baseline (``key=value``); groups
    without a baseline group are left out, the baseline groups themselves included (difference 0)."""
    base = baseline_of(groups, key, value)
    out = {}
    for g in groups:
        if (b := base[g.label]) is not None:
            out[g.label] = welch_interval(
                group_metric(g, metric, target, defaults), group_metric(b, metric, target, defaults)
            )
    return out


def learned_everywhere(runs: list[Run]) -> bool:
    """Every run with an outcome learned (no spikes, not stuck, not diverged), and there is one.
    Runs without an outcome (running, stopped, failed: a crash says nothing about the lr) are not counted."""
    judged = [r for r in runs if r.outcome is not None]
    return bool(judged) and all(r.outcome == "learned" for r in judged)


def lr_of(run: Run) -> float | None:
    """The run's peak ``optim.lr``; ``auto`` as the number the run resolved it to (its summary's ``lr``)."""
    value = setting(run, "optim.lr")
    try:
        return float(value) if value is not None else None
    except ValueError:
        lr = (run.summary or {}).get("lr")
        return float(lr) if isinstance(lr, (int, float)) else None


def curve(runs: list[Run], key: str) -> tuple[list[int], list[float], list[float], list[float]]:
    """(steps, mean, min, max) over runs at each step any of them logged ``key``."""
    by_step: dict[int, list[float]] = {}
    for r in runs:
        for s, v in finite_series(r.records, key):
            by_step.setdefault(s, []).append(v)
    steps = sorted(by_step)
    return (
        steps,
        [statistics.fmean(by_step[s]) for s in steps],
        [min(by_step[s]) for s in steps],
        [max(by_step[s]) for s in steps],
    )
