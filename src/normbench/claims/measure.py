"""From a claim's runs to each test's verdict: which runs form each side, their values, and
which runs make a test inconclusive (:mod:`.verdict` holds the rule itself)."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass, replace

from omegaconf import OmegaConf

from normbench.analysis.loading import Run, canonical_value, norm_value, setting
from normbench.analysis.stats import (  # seed_pairs: the pairing rule, shared with report
    FINISHED,
    LEARNED,
    default_targets,
    learned_everywhere,
    lr_of,
    run_layer_stats,
    seed_key,
    seed_means,
    seed_order,
    seed_pairs,
    time_to_target,
)
from normbench.claims import verdict as V
from normbench.claims.registry import Claim, Test
from normbench.claims.skip_eval import read_skip
from normbench.claims.timing import round_tps, timing_of, timing_record, value_of
from normbench.diag.outcomes import finite
from normbench.model import weight_init_std
from normbench.run.eval_file import downstream_value, split_metric


def select(runs: list[Run], where: dict) -> list[Run]:
    return [r for r in runs if all(setting(r, k) == canonical_value(k, norm_value(str(v))) for k, v in where.items())]


def metric_value(run: Run, metric: str, target: float | None) -> float | None:
    s = run.summary or {}
    if downstream := split_metric(metric):  # TASK/METRIC: the run's eval.json (normbench eval)
        return downstream_value(run.downstream, *downstream)
    if metric in ("best_val_loss", "final_val_loss"):
        return run.val_losses[1 if metric == "best_val_loss" else 0]
    if metric == "tokens_per_s":
        return s.get("tokens_per_s") if finite(s.get("tokens_per_s")) else None
    if metric.endswith("_to_target"):
        hit = time_to_target(run, target)
        return getattr(hit, metric.split("_")[0]) if hit else None
    if metric == "massive_onset_frac":  # never crossed: the run's end (1.0), against the claim
        step, steps = run_layer_stats(run).get("massive_ratio_step"), s.get("max_steps") or run.last_step
        return (step / steps if step is not None else 1.0) if steps and run.status == "completed" else None
    if metric == "skip_cost_deep":  # mean loss increase over the deeper half of the blocks
        inc = (read_skip(run.path) or {}).get("increase")
        return statistics.fmean(inc[len(inc) // 2 :]) if inc else None
    if metric == "learned":
        return 1.0 if run.outcome in LEARNED else 0.0
    if metric in ("attn_logit_peak", "attn_logit_peak_tau"):  # largest attn_logit_max (diag=full) over
        peaks = [max(v) for r in run.records if (v := r.get("attn_logit_max"))]  # blocks and diagnostic steps
        tau = float(setting(run, "optim.qk_clip_tau") or 100.0) if metric.endswith("_tau") else 1.0
        return max(peaks) / tau if peaks else None
    v = run_layer_stats(run).get(metric)
    return float(v) if finite(v) else None


def run_init(run: Run) -> float | None:
    """The weight init a run started from: the ``init_std`` its summary recorded; for a run from before
    that key, ``model.weight_init_std`` of its config (an old ``norm.width_init`` read as what it
    computed, d^-0.5)."""

    if (run.summary or {}).get("init_std") is not None:
        return float(run.summary["init_std"])
    if not run.config or "model" not in run.config:
        return None
    cfg = OmegaConf.create(run.config)
    if (cfg.get("norm") or {}).get("width_init"):
        return float(cfg.model.d_model) ** -0.5
    return weight_init_std(cfg)


def group_init(runs: list[Run]) -> float | list[float] | None:
    """The group's init_std: one number when its runs share it (as :mod:`.shared` makes sure), else the list."""
    inits = sorted({v for r in runs if (v := run_init(r)) is not None})
    return inits[0] if len(inits) == 1 else (inits or None)


def problems(label: str, runs: list[Run], outcomes_count: bool) -> list[str]:
    """Runs that keep a test from a verdict: unfinished ones always; stuck/diverged ones unless the
    test measures outcomes (then they are its data)."""
    out = []
    unfinished = [r for r in runs if r.status not in FINISHED]
    if unfinished:
        out.append(f"{label}: {len(unfinished)} of {len(runs)} runs not finished ({unfinished[0].status})")
    bad = [r for r in runs if r.outcome in ("stuck", "diverged")]
    if bad and not outcomes_count:
        kinds = ", ".join(
            f"{sum(r.outcome == k for r in bad)} {k}" for k in ("stuck", "diverged") if any(r.outcome == k for r in bad)
        )
        out.append(f"runs stuck or diverged in {label}: {kinds} of {len(runs)}")
    return out


def by_value(runs: list[Run], key: str) -> dict[str, list[Run]]:
    """The runs grouped by their value of ``key`` (as :func:`setting` spells it)."""
    out: dict[str, list[Run]] = {}
    for r in runs:
        out.setdefault(str(setting(r, key)), []).append(r)
    return out


def outcome_counts(runs: list[Run]) -> dict[str, int]:
    return dict(Counter(r.outcome_label for r in runs))


def tuned(runs: list[Run], key: str) -> tuple[str | None, list[Run]]:
    """One side of a test at its own best value of ``key`` (e.g. each arch at its own LR): among the
    values at which every seed finished and learned, the one with the lowest mean best val loss.
    Both sides are tuned by the same rule on the same grid; the winner is picked on the seeds it is
    then judged on, which flatters both sides alike. (None, runs) when no value learned everywhere."""
    ok = {
        v: rs
        for v, rs in by_value(runs, key).items()
        if all(r.status in FINISHED and r.outcome == "learned" and r.val_losses[1] is not None for r in rs)
    }
    if not ok:
        return None, runs
    best = min(ok, key=lambda v: statistics.fmean(r.val_losses[1] for r in ok[v]))
    return best, ok[best]


def _transform(values: list[float], how: str | None) -> list[float]:
    if how == "log":
        return [math.log(v) for v in values if v > 0]
    return values


@dataclass
class _Sides:
    """A test's group and baseline: their runs and labels. ``b_runs`` is None when the baseline is a
    fixed value (``b_label`` then names it) rather than runs."""

    g_runs: list[Run]
    b_runs: list[Run] | None
    g_label: str
    b_label: str

    @property
    def both(self) -> list[Run]:
        return self.g_runs + (self.b_runs or [])


def judge_test(test: Test, runs: list[Run], min_seeds: int, at: dict | None = None, timing=None) -> dict:
    """One test's verdict and what it was judged on. Each side is selected and, when the test tunes a
    key, put at its own best value before the target is set from its runs; whatever keeps the test from
    a verdict is collected on the way and handed to the rule of the test's kind (:mod:`.verdict`).
    ``at``: the scale's values for keys of the test's ``at`` (e.g. the deepest depth on GPUs).
    ``timing``: for a timing test (:data:`.timing.TIMING_METRICS`), ``(test, group runs, baseline runs)
    -> benchmark`` (:func:`.benchmark.timing`), or why none runs; without a benchmark the test is informative."""
    test = replace(test, at={k: str((at or {}).get(k, v)) for k, v in test.at.items()})
    sides, tuning, tuning_problems = _tune(test, _select_sides(test, runs))
    target = _target(test, sides.both)
    probs = _side_problems(test, sides, tuning_problems)
    bench = timing_of(test, sides.g_runs, sides.b_runs, timing)
    value = value_of(test, target, sides.g_runs, sides.b_runs, bench, metric_value)
    g_vals = _finished_values(sides.g_runs, value)
    b_vals = _finished_values(sides.b_runs, value) if sides.b_runs is not None else test.baseline
    paired = None
    if isinstance(bench, dict) and test.metric == "tokens_per_s":  # the benchmark's rounds are the values
        g_vals, b_vals = (round_tps(bench, side) for side in ("group", "baseline"))
        paired = list(zip(g_vals, b_vals))
    elif test.kind in ("difference", "on_par"):
        probs += _value_problems(test, sides, value, g_vals, b_vals)
        if sides.b_runs is not None and (paired := seed_pairs(sides.g_runs, sides.b_runs, value, test.transform)):
            g_vals, b_vals = [g for g, _ in paired], [b for _, b in paired]
    if test.kind == "largest_lr":
        res, g_vals, b_vals, n_seeds = _judge_largest_lr(test, sides, min_seeds, probs)
    else:
        res = _judge_values(test, sides, g_vals, b_vals, min_seeds, probs, paired=bool(paired))
        seeds = lambda rs: len({seed_key(r) for r in rs})  # the unit, not the runs
        n_seeds = min(seeds(sides.g_runs), seeds(sides.b_runs) if sides.b_runs is not None else seeds(sides.g_runs))
    res["interval"] = _interval(test.kind, bool(paired), sides.b_runs is not None)
    if tuning:
        res["tuned"] = tuning
    res.update(_described(test, res, target, n_seeds), groups=_groups(sides, g_vals, b_vals))
    if bench is not None:
        res.update(timing_record(bench, test.metric))
    return res


def _select_sides(test: Test, runs: list[Run]) -> _Sides:
    """The runs of each side at the test's ``at``, labelled by the settings that pick them."""
    label = lambda where: " ".join(f"{k}={v}" for k, v in {**test.at, **where}.items())
    g_runs = select(runs, {**test.at, **test.group})
    if not isinstance(test.baseline, dict):
        return _Sides(g_runs, None, label(test.group), f"the value {test.baseline:g}")
    return _Sides(g_runs, select(runs, {**test.at, **test.baseline}), label(test.group), label(test.baseline))


def _tune(test: Test, sides: _Sides) -> tuple[_Sides, dict | None, list[str]]:
    """Each side with runs at its own best value of the tuned key (:func:`tuned`), the record of what was
    chosen and of every value tried with its outcomes (so nothing is dropped silently), and a problem for
    each side where no value learned. Unchanged sides, no record and no problems when nothing is tuned."""
    if not test.tune:
        return sides, None, []
    pairs = (("group", sides.g_runs), ("baseline", sides.b_runs or []))
    tried = {side: {v: outcome_counts(rs) for v, rs in by_value(runs, test.tune).items()} for side, runs in pairs}
    chosen: dict[str, str | None] = {}
    chosen["group"], g_runs = tuned(sides.g_runs, test.tune)
    b_runs = sides.b_runs
    if b_runs is not None:
        chosen["baseline"], b_runs = tuned(b_runs, test.tune)
    labels = {"group": sides.g_label, "baseline": sides.b_label}
    record = {
        "key": test.tune,
        "chosen": {labels[side]: chosen.get(side) for side in labels},
        "tried": {labels[side]: tried[side] for side in labels},
    }
    failed = [
        f"{labels[side]}: no {test.tune} of the grid learned with every seed" for side, v in chosen.items() if v is None
    ]
    return replace(sides, g_runs=g_runs, b_runs=b_runs), record, failed


def _target(test: Test, runs: list[Run]) -> float | None:
    """The test's target; a time-to-target test without one takes the default the judged runs give
    (:func:`default_targets`: the loss every learned run reached)."""
    if test.target is None and test.metric.endswith("_to_target"):
        return next(iter(default_targets(runs).values()), None)
    return test.target


def _side_problems(test: Test, sides: _Sides, tuning_problems: list[str]) -> list[str]:
    """What keeps the test from a verdict, side by side (:func:`problems`). Outcomes are the data of
    outcome and largest-LR tests, so their stuck and diverged runs are no problem there."""
    outcomes_count = test.kind in ("outcome", "largest_lr")
    probs = problems(sides.g_label, sides.g_runs, outcomes_count) + tuning_problems
    if sides.b_runs is not None:
        probs += problems(sides.b_label, sides.b_runs, outcomes_count)
    return probs


def _finished_values(runs: list[Run], value) -> list[float]:
    """The finished runs' values, one per seed (the seed is the unit: runs of a side that share a seed, as a side
    pooled over a key the test does not fix, are averaged first; :func:`seed_means`)."""
    finished = [r for r in runs if r.status in FINISHED]
    if len({seed_key(r) for r in finished}) == len(finished):
        return [v for r in finished if (v := value(r)) is not None]
    means = seed_means(finished, value)
    return [means[s] for s in seed_order(means)]


def _value_problems(test: Test, sides: _Sides, value, g_vals: list[float], b_vals) -> list[str]:
    """A finished, healthy run without a value is named, never dropped; so are values that a log
    transform cannot compare."""
    out = []
    b_side = (sides.b_label, sides.b_runs or [], b_vals if sides.b_runs else [])
    for lab, rs, vs in ((sides.g_label, sides.g_runs, g_vals), b_side):
        healthy = [r for r in rs if r.status in FINISHED and r.outcome not in ("stuck", "diverged")]
        if missing := sum(value(r) is None for r in healthy):
            never = " (never reached the target)" if test.metric.endswith("_to_target") else ""
            if split_metric(test.metric):
                never = f" (no eval.json score: python -m normbench eval RUN_DIR --tasks {test.metric.split('/')[0]})"
            out.append(f"{lab}: {missing} of {len(rs)} runs have no {test.metric}{never}")
        if test.transform == "log" and (bad := sum(v <= 0 for v in vs)):
            out.append(f"{lab}: {bad} values <= 0 cannot be compared as log ratios")
    return out


def _judge_values(test: Test, sides: _Sides, g_vals, b_vals, min_seeds: int, probs: list[str], paired: bool) -> dict:
    """The rule of a difference, on-par or outcome test; a log transform compares ratios."""
    xs = _transform(g_vals, test.transform)
    if test.kind == "difference":
        base = _transform(b_vals, test.transform) if sides.b_runs is not None else b_vals
        return V.judge_difference(xs, base, test.direction, test.threshold, min_seeds, probs, paired=paired)
    if test.kind == "on_par":
        return V.judge_on_par(xs, _transform(b_vals, test.transform), test.band, min_seeds, probs, paired=paired)
    g = [r for r in sides.g_runs if r.status in FINISHED]
    b = [r for r in sides.b_runs if r.status in FINISHED]
    return V.judge_outcome(
        sum(r.outcome in LEARNED for r in g),
        len(g),
        sum(r.outcome in LEARNED for r in b),
        len(b),
        test.direction,
        test.threshold,
        min_seeds,
        probs,
    )


def _judge_largest_lr(test: Test, sides: _Sides, min_seeds: int, probs: list[str]) -> tuple[dict, list, list, int]:
    """Each side's largest LR of the grid at which every seed learned, by the rule of
    :func:`.verdict.judge_largest_lr`; returns its result, each side's value (that LR, if any) and the
    seeds it counted: seeds per LR of the grid, not runs over the whole grid."""
    grid = sorted({lr for r in sides.both if (lr := lr_of(r)) is not None})
    at_lr = lambda rs, lr: [r for r in rs if lr_of(r) == lr]
    best = lambda rs: max((lr for lr in grid if learned_everywhere(at_lr(rs, lr))), default=None)
    seeds = lambda rs: min((len(at_lr(rs, lr)) for lr in grid), default=0)
    g, b = sides.g_runs, sides.b_runs
    lr_g, lr_b = best(g), best(b)
    res = V.judge_largest_lr(
        lr_g, lr_b, grid, test.threshold or 1, seeds(g), seeds(b), min_seeds, probs, test.direction
    )
    res["largest_lr"] = {sides.g_label: lr_g, sides.b_label: lr_b}
    res["learned_share"] = {sides.g_label: _learned_share(g, grid), sides.b_label: _learned_share(b, grid)}
    return res, [lr_g] if lr_g else [], [lr_b] if lr_b else [], min(seeds(g), seeds(b))


def _learned_share(runs: list[Run], grid: list[float]) -> dict[float, float]:
    """Per LR, the share of the runs with an outcome that learned (what the rule asks of every seed):
    what the claim's figure draws."""
    share = {}
    for lr in grid:
        if judged := [r for r in runs if lr_of(r) == lr and r.outcome is not None]:
            share[lr] = sum(r.outcome == "learned" for r in judged) / len(judged)
    return share


def _interval(kind: str, paired: bool, baseline_runs: bool) -> str | None:
    """The interval the rule drew: by seed pairs when both sides ran the same seeds, else Welch's (one
    sample against a fixed value), Newcombe's for the shares of an outcome test; none for the largest LR."""
    return {
        "difference": "paired" if paired else ("welch" if baseline_runs else "one-sample"),
        "on_par": "paired" if paired else "welch",
        "outcome": "newcombe",
    }.get(kind)


def _described(test: Test, res: dict, target: float | None, n_seeds: int) -> dict:
    """The test's own settings beside its verdict; under a log transform the effect also as a ratio."""
    return dict(
        name=test.name,
        kind=test.kind,
        metric=test.metric,
        transform=test.transform,
        ratio=math.exp(res["effect"]) if test.transform == "log" and res["effect"] is not None else None,
        threshold=test.band if test.kind == "on_par" else test.threshold,
        direction=test.direction if test.kind != "on_par" else None,
        informative=test.informative,
        target=target,
        n_seeds=n_seeds,
    )


def _groups(sides: _Sides, g_vals, b_vals) -> dict:
    """Each side's values, their mean, its runs, their outcomes and init; a fixed baseline is no group."""
    group = lambda vals, runs: {
        "values": vals,
        "mean": statistics.fmean(vals) if vals else None,
        "runs": len(runs),
        "outcomes": outcome_counts(runs),
        "init_std": group_init(runs),
    }
    out = {sides.g_label: group(g_vals, sides.g_runs)}
    if sides.b_runs is not None:
        out[sides.b_label] = group(b_vals, sides.b_runs)
    return out


def judge_claim(claim: Claim, runs: list[Run], scale: str, min_seeds: int = V.MIN_SEEDS, at=None, timing=None) -> dict:
    """Every test's verdict and the claim's; ``timing``: the timing tests' benchmark (:func:`judge_test`)."""
    parts = [judge_test(t, runs, min_seeds, at, timing) for t in claim.tests]
    first = parts[0]
    judged = [p for p in parts if not p["informative"]] or parts
    verdict = V.combine([p["verdict"] for p in judged])
    reasons = [f"{p['name']}: {p['reason']}" for p in judged if p["verdict"] != V.HOLDS and p["reason"]]
    return {
        "claim": claim.id,
        "statement": claim.claim,
        "paper": claim.paper,
        "verdict": verdict,
        "metric": first["metric"],
        "transform": first["transform"],
        "effect": first["effect"],
        "ci": first["ci"],
        "threshold": first["threshold"],
        "n_seeds": min(p["n_seeds"] for p in judged),
        "scale": scale,
        "groups": first["groups"],
        "reason": "; ".join(reasons) if verdict != V.HOLDS and reasons else None,
        "tests": parts,
    }
