"""From a claim's runs to each test's verdict: which runs form each side, their values, and
which runs make a test inconclusive (:mod:`.verdict` holds the rule itself)."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import replace

from normbench.report.loading import Run, canonical_value, norm_value, setting
from normbench.report.stats import LEARNED, default_targets, learned_everywhere, lr_of, run_layer_stats, time_to_target
from normbench.reproduce import verdict as V
from normbench.reproduce.claims import Claim, Test
from normbench.reproduce.skip_eval import read_skip
from normbench.train.outcomes import finite

FINISHED = ("completed", "diverged")


def select(runs: list[Run], where: dict) -> list[Run]:
    return [r for r in runs if all(setting(r, k) == canonical_value(k, norm_value(str(v))) for k, v in where.items())]


def metric_value(run: Run, metric: str, target: float | None) -> float | None:
    s = run.summary or {}
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
    from omegaconf import OmegaConf

    from normbench.model import weight_init_std

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
        )  # noqa: E501
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


def seed_pairs(g_runs: list[Run], b_runs: list[Run], value, transform: str | None) -> list[tuple] | None:
    """[(group value, baseline value)] ordered by seed, when both sides ran each seed once and every run has a
    value (a log transform: a positive one); else None (Welch's interval then). Same seed, same data order and
    val batches (normbench.data.batches): the pairs share their sampling noise (common random numbers)."""
    sides = []
    for runs in (g_runs, b_runs):
        by_seed = {setting(r, "seed"): value(r) for r in runs if r.status in FINISHED}
        if len(by_seed) != len(runs) or any(v is None or (transform == "log" and v <= 0) for v in by_seed.values()):
            return None
        sides.append(by_seed)
    if set(sides[0]) != set(sides[1]) or len(sides[0]) < 2:
        return None
    return [(sides[0][s], sides[1][s]) for s in sorted(sides[0], key=lambda s: float(s))]


def _transform(values: list[float], how: str | None) -> list[float]:
    if how == "log":
        return [math.log(v) for v in values if v > 0]
    return values


def judge_test(test: Test, runs: list[Run], min_seeds: int, at: dict | None = None) -> dict:
    """``at``: the scale's values for keys of the test's ``at`` (e.g. the deepest depth on GPUs)."""
    test = replace(test, at={k: str((at or {}).get(k, v)) for k, v in test.at.items()})
    g_runs = select(runs, {**test.at, **test.group})
    b_runs = select(runs, {**test.at, **test.baseline}) if isinstance(test.baseline, dict) else None
    tuned_to: dict[str, str | None] = {}
    tried: dict[str, dict] = {}  # every value tried on each side, with its outcomes: nothing dropped silently
    if test.tune:
        for side, rs in (("group", g_runs), ("baseline", b_runs or [])):
            tried[side] = {v: outcome_counts(rs_v) for v, rs_v in by_value(rs, test.tune).items()}
        # each side at its own best value of the tuned key, before the target is set from the runs
        tuned_to["group"], g_runs = tuned(g_runs, test.tune)
        if b_runs is not None:
            tuned_to["baseline"], b_runs = tuned(b_runs, test.tune)
    both = g_runs + (b_runs or [])
    target = test.target
    if target is None and test.metric.endswith("_to_target"):
        target = next(iter(default_targets(both).values()), None)
    label = lambda where: " ".join(f"{k}={v}" for k, v in {**test.at, **where}.items())  # noqa: E731
    g_label = label(test.group)
    b_label = label(test.baseline) if b_runs is not None else f"the value {test.baseline:g}"
    probs = problems(g_label, g_runs, test.kind in ("outcome", "largest_lr"))
    probs += [f"{lab}: no {test.tune} of the grid learned with every seed" for side, lab in
              (("group", g_label), ("baseline", b_label)) if side in tuned_to and tuned_to[side] is None]  # fmt: skip
    if b_runs is not None:
        probs += problems(b_label, b_runs, test.kind in ("outcome", "largest_lr"))
    vals = lambda rs: [
        v for r in rs if r.status in FINISHED and (v := metric_value(r, test.metric, target)) is not None
    ]  # noqa: E501,E731
    g_vals, b_vals = vals(g_runs), (vals(b_runs) if b_runs is not None else test.baseline)
    if test.kind in ("difference", "on_par"):  # a finished, healthy run without a value is named, never dropped
        for lab, rs, vs in ((g_label, g_runs, g_vals), (b_label, b_runs or [], b_vals if b_runs else [])):
            healthy = [r for r in rs if r.status in FINISHED and r.outcome not in ("stuck", "diverged")]
            if missing := sum(metric_value(r, test.metric, target) is None for r in healthy):
                probs.append(
                    f"{lab}: {missing} of {len(rs)} runs have no {test.metric}"
                    + (" (never reached the target)" if test.metric.endswith("_to_target") else "")
                )
            if test.transform == "log" and (bad := sum(v <= 0 for v in vs)):
                probs.append(f"{lab}: {bad} values <= 0 cannot be compared as log ratios")
    paired = None
    if test.kind in ("difference", "on_par") and b_runs is not None:
        paired = seed_pairs(g_runs, b_runs, lambda r: metric_value(r, test.metric, target), test.transform)
        if paired:
            g_vals, b_vals = [g for g, _ in paired], [b for _, b in paired]
    xs = _transform(g_vals, test.transform)
    if test.kind == "difference":
        base = _transform(b_vals, test.transform) if b_runs is not None else b_vals
        res = V.judge_difference(xs, base, test.direction, test.threshold, min_seeds, probs, paired=bool(paired))
    elif test.kind == "on_par":
        res = V.judge_on_par(xs, _transform(b_vals, test.transform), test.band, min_seeds, probs, paired=bool(paired))
    elif test.kind == "outcome":
        done = lambda rs: [r for r in rs if r.status in FINISHED]  # noqa: E731
        g, b = done(g_runs), done(b_runs)
        res = V.judge_outcome(sum(r.outcome in LEARNED for r in g), len(g), sum(r.outcome in LEARNED for r in b),
                              len(b), test.direction, test.threshold, min_seeds, probs)  # fmt: skip
    else:  # largest_lr
        grid = sorted({lr for r in both if (lr := lr_of(r)) is not None})
        best = lambda rs: max(
            (lr for lr in grid if learned_everywhere([r for r in rs if lr_of(r) == lr])), default=None
        )  # noqa: E501,E731
        seeds = lambda rs: min((sum(lr_of(r) == lr for r in rs) for lr in grid), default=0)  # noqa: E731
        lr_g, lr_b = best(g_runs), best(b_runs)
        res = V.judge_largest_lr(
            lr_g, lr_b, grid, test.threshold or 1, seeds(g_runs), seeds(b_runs), min_seeds, probs, test.direction
        )
        res["largest_lr"] = {g_label: lr_g, b_label: lr_b}
        # per LR, the share of the runs with an outcome that learned (what the rule asks of every seed): the figure
        share = lambda rs: {  # noqa: E731
            lr: sum(r.outcome == "learned" for r in at_lr) / len(at_lr)
            for lr in grid
            if (at_lr := [r for r in rs if lr_of(r) == lr and r.outcome is not None])
        }
        res["learned_share"] = {g_label: share(g_runs), b_label: share(b_runs)}
        g_vals, b_vals = [lr_g] if lr_g else [], [lr_b] if lr_b else []
    res["interval"] = {
        "difference": "paired" if paired else ("welch" if b_runs is not None else "one-sample"),
        "on_par": "paired" if paired else "welch",
        "outcome": "newcombe",
    }.get(test.kind)
    if test.tune:
        res["tuned"] = {
            "key": test.tune,
            "chosen": {g_label: tuned_to.get("group"), b_label: tuned_to.get("baseline")},
            "tried": {g_label: tried.get("group", {}), b_label: tried.get("baseline", {})},
        }
    n_seeds = min(len(g_runs), len(b_runs) if b_runs is not None else len(g_runs))
    if test.kind == "largest_lr":  # seeds per LR of the grid, not runs over the whole grid
        n_seeds = min(seeds(g_runs), seeds(b_runs))
    res.update(
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
        groups={
            g_label: {"values": g_vals, "mean": statistics.fmean(g_vals) if g_vals else None, "runs": len(g_runs),
                      "outcomes": outcome_counts(g_runs), "init_std": group_init(g_runs)},
            **({b_label: {"values": b_vals, "mean": statistics.fmean(b_vals) if b_vals else None,
                          "runs": len(b_runs), "outcomes": outcome_counts(b_runs),
                          "init_std": group_init(b_runs)}} if b_runs is not None else {}),
        },
    )  # fmt: skip
    return res


def judge_claim(claim: Claim, runs: list[Run], scale: str, min_seeds: int = V.MIN_SEEDS, at=None) -> dict:
    parts = [judge_test(t, runs, min_seeds, at) for t in claim.tests]
    first = parts[0]
    judged = [p for p in parts if not p["informative"]]
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
