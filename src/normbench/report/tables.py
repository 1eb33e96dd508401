"""The report's tables, as (header, rows) of strings. Every per-group table has an
``outcomes`` column (how many runs learned / were unstable / stuck / diverged, and how many
have no outcome yet), so no number is read without knowing what it averages."""

from __future__ import annotations

import statistics

import yaml

from normbench.analysis import numbers
from normbench.analysis.loading import Group, Run, setting
from normbench.analysis.stats import (
    Difference,
    compare,
    learned_everywhere,
    loss_pool,
    lr_of,
    mean_std,
    outcome_counts,
    run_layer_stats,
    status_counts,
    target_for,
    time_to_target,
)
from normbench.diag.outcomes import MASSIVE_THRESHOLD, finite
from normbench.model import norm_class

DASH = "—"


def _sort_key(g: Group):
    pool, _ = loss_pool(g)
    bests = [b for r in pool if (b := r.val_losses[1]) is not None]
    return (not bests, statistics.fmean(bests) if bests else 0.0, g.label)


def sort_groups(groups: list[Group]) -> list[Group]:
    """By mean best val loss; groups without one last."""
    return sorted(groups, key=_sort_key)


def _reached(runs: list[Run], target, defaults) -> tuple[list, int]:
    hits = [x for r in runs if (x := time_to_target(r, target_for(r, target, defaults))) is not None]
    return hits, len(runs)


LEAK_NOTE = "leaks the future: batch statistics over later positions (norm.allow_leak=true), not a causal-LM result"


class _NormSettings:
    """A run's ``norm.*`` settings as attributes (YAML-parsed: ``"5"`` -> 5), as a norm class's ``leaks`` reads them."""

    def __init__(self, run: Run):
        self._run = run

    def __getattr__(self, key: str):
        value = setting(self._run, "norm" if key == "name" else f"norm.{key}")
        try:
            return None if value is None else yaml.safe_load(value)
        except yaml.YAMLError:
            return value


def leaked(run: Run) -> bool:
    """A run trained with a forward that sees later positions, as its norm class declares (``leaks``,
    norm/norm_api.py): norm=batchnorm, or powernorm with a batch-statistic warmup (both train only with
    norm.allow_leak=true; docs/architectures.md §2)."""
    norm = setting(run, "norm")
    return norm is not None and norm_class(norm).leaks(_NormSettings(run))


def _of_n(text: str, k: int, n: int) -> str:
    return text if k == n or text == DASH else f"{text} ({k}/{n})"


LOADED = "measured on a loaded machine"
FLOPS_AGREE, TPS_SPREAD = 0.02, 0.20


def loaded_spread(runs: list[Run]) -> tuple[float, float] | None:
    """(lowest, highest) tokens/s of a group whose runs do the same work per token (FLOPs/token within 2%)
    yet differ in tokens/s by more than 20%: the spread is the machine's (other work on its cores), not the
    model's, and so are the group's tokens/s and seconds. None otherwise (or without both numbers)."""
    pairs = [
        (f, t)
        for r in runs
        if finite(f := (r.summary or {}).get("flops_per_token"))
        and finite(t := (r.summary or {}).get("tokens_per_s"))
        and f > 0
        and t > 0
    ]
    if len(pairs) < 2:
        return None
    fpt, tps = [f for f, _ in pairs], [t for _, t in pairs]
    if max(fpt) > (1 + FLOPS_AGREE) * min(fpt) or max(tps) <= (1 + TPS_SPREAD) * min(tps):
        return None
    return min(tps), max(tps)


def sweep_loaded(groups: list[Group]) -> bool:
    """Whether the machine was loaded while these groups ran: :func:`loaded_spread` in any one group. The load
    is the machine's, not a group's: the groups of a sweep ran side by side under it, and a group whose seeds
    happen to agree within 20% is no better measured than one whose seeds do not, so every group is flagged."""
    return any(loaded_spread(g.runs) is not None for g in groups)


def _flagged(text: str, runs: list[Run], loaded: bool, with_range: bool = False) -> str:
    """A group's tokens/s or seconds cell, flagged (with its runs' tokens/s range) when the sweep was loaded."""
    if not loaded or text == DASH:
        return text
    tps = [t for r in runs if finite(t := (r.summary or {}).get("tokens_per_s")) and t > 0]
    if with_range and len(tps) > 1:
        return f"{text} ({min(tps):,.0f}-{max(tps):,.0f}: {LOADED})"
    return f"{text} ({LOADED})"


def _final_is_best(groups: list[Group]) -> bool:
    """Every averaged run ended at its best val loss (then one column says both)."""
    pairs = [r.val_losses for g in groups for r in loss_pool(g)[0]]
    return bool(pairs) and all(f is not None and f == b for f, b in pairs)


def group_notes(g: Group) -> list[str]:
    """The main table's notes of a group: that it leaked the future, then why each run did not complete."""
    notes = dict.fromkeys(f"{r.status}: {r.reason}" for r in g.runs if r.status != "completed")
    return list({LEAK_NOTE: None, **notes} if any(leaked(r) for r in g.runs) else notes)


def main_table(groups: list[Group], target=None, defaults=None) -> tuple[list[str], list[list[str]]]:
    """One row per group; the final val loss column only when some run's final loss is not its best;
    tokens/s flagged with their range where the machine was loaded (:func:`sweep_loaded`)."""
    defaults = defaults or {}
    loaded = sweep_loaded(groups)
    single = target if target is not None else (next(iter(defaults.values())) if len(defaults) == 1 else None)
    col = f"steps to val loss ≤ {single:g}" if single is not None else "steps to target"
    same = _final_is_best(groups)
    best = "best val loss (= final in every run)" if same else "best val loss"
    header = ["group", "runs", "outcomes", "status", "final val loss", best, col, "tokens/s", "spikes", "notes"]
    rows = []
    for g in sort_groups(groups):
        pool, partial = loss_pool(g)
        mark = " (partial)" if partial else ""
        finals = [f for r in pool if (f := r.val_losses[0]) is not None]
        bests = [b for r in pool if (b := r.val_losses[1]) is not None]
        hits, n = _reached(g.runs, target, defaults)
        steps = _of_n(mean_std([h.steps for h in hits], ".0f"), len(hits), n)
        # steady-state tokens/s of the runs whose losses are averaged (summary.json)
        tps = [t for r in pool if finite(t := (r.summary or {}).get("tokens_per_s"))]
        spikes = [int(c) for r in g.runs if finite(c := (r.summary or {}).get("spikes"))]
        notes = group_notes(g)
        rows.append(
            [
                g.label,
                str(len(g.runs)),
                outcome_counts(g.runs),
                status_counts(g.runs),
                mean_std(finals, suffix=mark),
                mean_std(bests, suffix=mark),
                steps,
                _flagged(f"{statistics.fmean(tps):,.0f}" if tps else DASH, pool, loaded, with_range=True),
                str(sum(spikes)) if spikes else DASH,
                "; ".join(notes),
            ]
        )
    if same:
        header, rows = header[:4] + header[5:], [r[:4] + r[5:] for r in rows]
    return header, rows


def target_spreads(groups: list[Group], target=None, defaults=None) -> list[float]:
    """The std over seeds of the steps to target, for each group where two or more runs reached it."""
    out = []
    for g in groups:
        hits, _ = _reached(g.runs, target, defaults or {})
        if len(hits) > 1:
            out.append(statistics.stdev([h.steps for h in hits]))
    return out


def target_table(groups: list[Group], target=None, defaults=None) -> tuple[list[str], list[list[str]]]:
    """Steps, tokens and seconds to the target val loss: mean ± std over the runs that reached it; the
    seconds flagged where the sweep's tokens/s say the machine was loaded (:func:`sweep_loaded`)."""
    defaults = defaults or {}
    loaded = sweep_loaded(groups)
    header = ["group", "outcomes", "target", "reached", "steps", "tokens", "seconds"]
    rows = []
    for g in sort_groups(groups):
        hits, n = _reached(g.runs, target, defaults)
        targets = sorted({t for r in g.runs if (t := target_for(r, target, defaults)) is not None})
        rows.append(
            [
                g.label,
                outcome_counts(g.runs),
                ", ".join(f"{t:g}" for t in targets) or DASH,
                f"{len(hits)}/{n}",
                mean_std([h.steps for h in hits], ".0f"),
                mean_std([h.tokens for h in hits], ",.0f"),
                _flagged(mean_std([h.seconds for h in hits], ".1f"), g.runs, loaded),
            ]
        )
    return header, rows


def layer_table(groups: list[Group]) -> tuple[list[str], list[list[str]]] | None:
    """End-of-run per-layer statistics (normbench.diag.outcomes.layer_stats), mean ± std over the
    completed runs; None when no run has diagnostics."""
    header = [
        "group",
        "outcomes",
        "variance growth (last/first block)",
        "grad spread (first/last block)",
        "grad CV across blocks",
        "peak massive ratio",
        f"first step massive ratio > {MASSIVE_THRESHOLD:g}",
        "final max |logit|",
    ]
    rows, any_data = [], False
    for g in sort_groups(groups):
        pool, partial = loss_pool(g)
        stats = [run_layer_stats(r) for r in pool]
        vals = lambda k, stats=stats: [s[k] for s in stats if finite(s.get(k))]
        mark = " (partial)" if partial else ""
        any_data |= any(vals(k) for k in ("var_growth", "grad_cv", "logit_maxabs"))
        crossed = vals("massive_ratio_step")
        rows.append(
            [
                g.label,
                outcome_counts(g.runs),
                mean_std(vals("var_growth"), ".3g", mark),
                mean_std(vals("grad_spread"), ".3g", mark),
                mean_std(vals("grad_cv"), ".3g", mark),
                mean_std(vals("massive_ratio_peak"), ".3g", mark),
                _of_n(mean_std(crossed, ".0f"), len(crossed), len(stats)) if crossed else "never",
                mean_std(vals("logit_maxabs"), ".3g", mark),
            ]
        )
    return (header, rows) if any_data else None


def lr_sweep(groups: list[Group]) -> dict[str, dict[float, list[Run]]] | None:
    """series -> lr -> runs, or None when no series tries two learning rates (an optimizer
    sweep has one default lr per optimizer: that is not an lr sweep)."""
    sweep: dict[str, dict[float, list[Run]]] = {}
    for g in groups:
        for r in g.runs:
            if (lr := lr_of(r)) is not None:
                sweep.setdefault(g.series, {}).setdefault(lr, []).append(r)
    return sweep if any(len(by_lr) > 1 for by_lr in sweep.values()) else None


def lr_table(sweep: dict[str, dict[float, list[Run]]]) -> tuple[list[str], list[list[str]]]:
    """Per series: the outcomes at each lr, and the largest lr at which every seed learned."""
    header = ["group", "outcomes by learning rate", "largest lr where every seed learned", "best val loss there"]
    rows = []
    for series_label, by_lr in sweep.items():
        good = [lr for lr, runs in by_lr.items() if learned_everywhere(runs)]
        best = DASH
        if good:
            done = [r for r in by_lr[max(good)] if r.outcome == "learned"]
            best = mean_std([b for r in done if (b := r.val_losses[1]) is not None])
        tried = "; ".join(f"{lr:g}: {outcome_counts(by_lr[lr])}" for lr in sorted(by_lr))
        largest = DASH
        if good:
            other = [r for r in by_lr[max(good)] if r.outcome is None]
            largest = f"{max(good):g}" + (f" ({outcome_counts(other)})" if other else "")
        rows.append([series_label, tried, largest, best])
    return header, rows


def _diff(d: Difference, fmt: str) -> str:
    if d.diff is None:
        return DASH
    if d.low is None:
        return f"{d.diff:+{fmt}} (n={d.n} vs {d.n_base}: no interval)"
    return numbers.interval(d.diff, d.low, d.high, fmt)


def baseline_table(groups: list[Group], key: str, value: str, target=None, defaults=None):
    """Each group's difference from its baseline group (same settings but ``key=value``)."""
    metrics = (("best val loss", ".4f"), ("final val loss", ".4f"), ("steps to target", ".0f"))
    diffs = {m: compare(groups, key, value, m, target, defaults) for m, _ in metrics}
    header = ["group", "outcomes", "baseline", *(f"Δ {m} [95% CI]" for m, _ in metrics)]
    rows = []
    for g in sort_groups(groups):
        if g.label not in diffs["best val loss"]:
            continue
        base = {**g.settings, key: value}
        cells = [_diff(diffs[m][g.label], fmt) for m, fmt in metrics] if base != g.settings else ["(baseline)"] * 3
        rows.append([g.label, outcome_counts(g.runs), " ".join(f"{k}={v}" for k, v in base.items()), *cells])
    return header, rows


def run_reason(run: Run) -> str:
    """The all-runs table's reason of a run: that it leaked the future, then its status's reason."""
    return "; ".join(x for x in (LEAK_NOTE if leaked(run) else "", run.reason) if x)


def runs_table(groups: list[Group], target=None, defaults=None) -> tuple[list[str], list[list[str]]]:
    header = [
        "run",
        "group",
        "seed",
        "status",
        "outcome",
        "step",
        "best val loss",
        "steps to target",
        "tokens to target",
        "seconds to target",
        "spikes",
        "reason",
    ]
    rows = []
    for g in groups:
        for r in g.runs:
            t = target_for(r, target, defaults or {})
            hit = time_to_target(r, t)
            not_reached = DASH if t is None else "not reached"
            best = r.val_losses[1]
            spikes = (r.summary or {}).get("spikes")
            rows.append(
                [
                    r.name,
                    g.label,
                    setting(r, "seed") or DASH,
                    r.status,
                    r.outcome or DASH,
                    str(r.last_step if r.last_step is not None else DASH),
                    f"{best:.4f}" if best is not None else DASH,
                    f"{hit.steps:.0f}" if hit else not_reached,
                    f"{hit.tokens:,.0f}" if hit else not_reached,
                    f"{hit.seconds:.1f}" if hit else not_reached,
                    str(int(spikes)) if finite(spikes) else DASH,
                    run_reason(r),
                ]
            )
    return header, rows
