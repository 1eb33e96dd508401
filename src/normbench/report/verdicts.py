"""The report's answer: for each factor the sweep varied, the effect of each value against a baseline value.

A factor is a grouping key (``arch``, ``norm``, ``optim.lr``, ...). Its baseline is the value
``--baseline KEY=VALUE`` names, else the config group's default (conf/config.yaml's defaults list:
``arch=pre_ln``, ``norm=rmsnorm``, ...) when the sweep ran it, else the first value the sweep ran.
The effect of a value is the mean difference of the metric from the baseline *within each setting of
the other factors* (e.g. ``post_ln`` minus ``pre_ln`` at each norm), pooled over those settings with the
seed as the unit (:mod:`.contrasts`): per seed, the difference averaged over the settings, then the
t-interval over seeds (n_seeds − 1 degrees of freedom); Welch's over the per-seed means where the seeds
differ between the sides. Beside it, the effect at each setting, and a note where those disagree.

The box makes every pairwise comparison within each factor (the rows against the baseline, and the pairs a
ranking needs, each shown as a row of its own); their p-values are Holm-adjusted together
(:func:`.contrasts.holm`). The interval of a row is its comparison's alone (the header says so; Holm's step-down
has no interval of its own), the call beside it is the adjusted one, and a row from 2 seeds says that its interval
rests on one degree of freedom. A difference is called
(``post_ln worse``) and ranked (``<``) only where it survives that adjustment; an interval that contains
zero reads "no detectable difference". Where every compared run got stuck or diverged, the losses compare
nothing that learned: the box says no verdict can be made.
"""

from __future__ import annotations

import difflib
import statistics
from dataclasses import dataclass, field
from itertools import combinations

import yaml

from normbench.analysis import numbers
from normbench.analysis.contrasts import Cell, Contrast, contrast, disagreement, holm, per_cell
from normbench.analysis.loading import Group, Run
from normbench.analysis.stats import METRICS, loss_pool, metric_fn, outcome_counts, target_for
from normbench.config.files import config_dir
from normbench.errors import ConfigError
from normbench.run.eval_file import higher_is_better, split_metric

METRIC_NAMES = {k.replace(" ", "_"): k for k in METRICS}  # --metric best_val_loss -> "best val loss"
ALPHA = 0.05  # family-wise, over the box's comparisons
UNITS = {"best val loss": "nats", "final val loss": "nats", "steps to target": "steps", "seconds to target": "s"}


def metric_name(text: str) -> str:
    """``best_val_loss`` (or ``best val loss``) -> the metric's name, a downstream ``TASK/METRIC`` as it is;
    ConfigError naming the choices otherwise."""

    if split_metric(text.strip()):
        return text.strip()
    key = text.strip().replace(" ", "_").replace("-", "_")
    if key in METRIC_NAMES:
        return METRIC_NAMES[key]
    near = difflib.get_close_matches(key, list(METRIC_NAMES), n=1)
    hint = f" (did you mean {near[0]}?)" if near else ""
    choices = ", ".join(METRIC_NAMES)
    raise ConfigError(f"--metric {text} is not a metric{hint}; choose one of: {choices}, or TASK/METRIC (eval.json)")


def higher_better(metric: str, runs: list[Run]) -> bool:
    """Whether a larger ``metric`` is better: only a downstream one can be (accuracies)."""
    split = split_metric(metric)
    return bool(split) and higher_is_better((r.downstream for r in runs), *split)


def better_word(metric: str, groups: list[Group]) -> str:
    """``higher`` or ``lower``: which way ``metric`` is better, for the box's words."""
    return "higher" if higher_better(metric, [r for g in groups for r in g.runs]) else "lower"


def unit_text(metric: str) -> str:
    """`` (nats)``, `` (steps)``...; nothing for a metric without a unit (a downstream accuracy)."""
    return f" ({UNITS[metric]})" if metric in UNITS else ""


@dataclass
class Effect:
    """``value`` minus ``base`` of one factor, pooled over the settings of the other factors (:mod:`.contrasts`)."""

    key: str
    value: str
    base: str
    pooled: Contrast = field(default_factory=Contrast)
    per_setting: list[tuple[str, Contrast]] = field(default_factory=list)  # the interaction; [] for one setting
    note: str | None = None  # where the settings disagree
    left_out: list[str] = field(default_factory=list)  # runs without a value (diverged, not reached, ...)
    failed: bool = False  # every compared run with an outcome got stuck or diverged
    p_holm: float | None = None  # the p-value adjusted over the box's comparisons
    higher: bool = False  # a larger value is better (a downstream accuracy); else lower (a loss)

    @property
    def diff(self) -> float | None:
        return self.pooled.diff

    @property
    def called(self) -> bool:
        """The difference is detectable after the box's adjustment (or, outside a box, at 95%)."""
        if self.p_holm is None:
            return self.pooled.separated
        return self.pooled.separated and self.p_holm < ALPHA

    @property
    def word(self) -> str:
        c = self.pooled
        if self.failed:
            return "no verdict: every compared run got stuck or diverged"
        if c.diff is None:
            return "no value on one side"
        if c.low is None:
            return "no interval (needs 2 seeds a side)"
        if not c.separated:
            return "no detectable difference"
        if not self.called:
            return f"not detectable after Holm's adjustment (p {c.p:.2g} → {self.p_holm:.2g})"
        if self.higher:
            return f"{self.value} better (higher)" if c.low > 0 else f"{self.value} worse (lower)"
        return f"{self.value} better (lower)" if c.high < 0 else f"{self.value} worse (higher)"


def config_defaults() -> dict[str, str]:
    """The config groups' defaults (``arch: pre_ln``, ...), from conf/config.yaml's defaults list."""

    try:
        raw = yaml.safe_load((config_dir() / "config.yaml").read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return {}
    out = {}
    for item in raw.get("defaults") or []:
        if isinstance(item, dict):
            for k, v in item.items():
                if isinstance(v, str) and not k.startswith("override"):
                    out[k] = v
    return out


def factor_values(groups: list[Group]) -> dict[str, list[str]]:
    """Each grouping key's values, in the order the sweep ran them."""
    keys = list(groups[0].settings) if groups else []
    return {k: list(dict.fromkeys(g.settings[k] for g in groups)) for k in keys}


def baselines(groups: list[Group], chosen: tuple[str, str] | None = None) -> dict[str, str]:
    """The baseline value of every factor with two or more values."""
    defaults = config_defaults()
    out = {}
    for key, values in factor_values(groups).items():
        if len(values) < 2:
            continue
        if chosen and chosen[0] == key:
            out[key] = chosen[1]
        else:
            out[key] = defaults[key] if defaults.get(key) in values else values[0]
    return out


def _value_fn(metric: str, target, defaults):
    fn = metric_fn(metric)

    def value(run: Run):
        if run.status != "completed":  # diverged and unfinished runs have no loss to average (loss_pool)
            return None
        return fn(run, target_for(run, target, defaults or {}))

    return value


def effect(
    groups: list[Group], key: str, value: str, base: str, metric: str = "best val loss", target=None, defaults=None
) -> Effect:
    """``value`` minus ``base`` of ``key``, within each setting of the other keys, pooled with the seed as the unit."""
    by_settings = {tuple(sorted(g.settings.items())): g for g in groups}
    get = _value_fn(metric, target, defaults)
    cells = []
    for g in groups:
        if g.settings.get(key) == value:
            b = by_settings.get(tuple(sorted({**g.settings, key: base}.items())))
            if b is not None:
                cells.append(Cell(" ".join(f"{k}={v}" for k, v in g.settings.items() if k != key), g, b))
    out = Effect(key, value, base, contrast(cells, get), per_cell(cells, get))
    out.note = disagreement([(label, c) for (label, c), cell in zip(out.per_setting, cells) if not _failed(cell)])
    out.per_setting = [
        (label + (" (all stuck or diverged)" if _failed(cell) else ""), c)
        for (label, c), cell in zip(out.per_setting, cells)
    ]
    runs = [r for c in cells for r in c.group.runs + c.base.runs]
    out.left_out = [f"{r.name} ({r.outcome_label})" for r in runs if get(r) is None]
    out.failed = _all_failed(runs)
    out.higher = higher_better(metric, runs)
    return out


def _all_failed(runs: list[Run]) -> bool:
    """Every run with an outcome got stuck or diverged (and there is one): their losses compare nothing learned."""
    judged = [r for r in runs if r.outcome is not None]
    return bool(judged) and all(r.outcome in ("stuck", "diverged") for r in judged)


def _failed(cell: Cell) -> bool:
    return _all_failed(cell.group.runs + cell.base.runs)


def _values(group: Group, get) -> list[float]:
    pool, _ = loss_pool(group)
    return [v for r in pool if (v := get(r)) is not None]


@dataclass
class Box:
    """The verdict box: its table, the ranking lines, how many comparisons it makes, and a line instead of a
    verdict when every run got stuck or diverged."""

    header: list[str]
    rows: list[list[str]]
    ranks: list[str]
    comparisons: int
    no_verdict: str | None


def comparisons(groups: list[Group], chosen=None, metric="best val loss", target=None, defaults=None) -> dict:
    """(key, value, base) -> :class:`Effect` for every pair of values within each factor (the rows put each value
    against the baseline; a ranking needs the other pairs), their p-values Holm-adjusted together."""
    out = {}
    for key, base in baselines(groups, chosen).items():
        values = factor_values(groups)[key]
        pairs = [(v, base) for v in values if v != base]
        if len(values) > 2:
            pairs += [(a, b) for a, b in combinations([v for v in values if v != base], 2)]
        for a, b in pairs:
            out[(key, a, b)] = effect(groups, key, a, b, metric, target, defaults)
    tested = [e for e in out.values() if e.pooled.p is not None]
    for e, adjusted in zip(tested, holm([e.pooled.p for e in tested]), strict=True):
        e.p_holm = adjusted
    return out


def ranking(family: dict, key: str, values: list[str], base: str) -> str | None:
    """``pre_ln < post_ln ≈ peri_ln``: the values by effect against the baseline, ``<`` only where the
    neighbouring tiers separate after the box's Holm adjustment; None when no two values separate."""
    eff = {v: (0.0 if v == base else family[(key, v, base)].diff) for v in values}
    order = sorted((v for v in values if eff[v] is not None), key=lambda v: eff[v])
    if len(order) < 2:
        return None

    def above(v: str, w: str) -> bool:  # v detectably higher than w
        e = family.get((key, v, w)) or family.get((key, w, v))
        return e.called and (e.diff > 0) == (e.value == v)

    tiers: list[list[str]] = [[order[0]]]
    for v in order[1:]:
        if above(v, tiers[-1][0]):
            tiers.append([v])
        else:
            tiers[-1].append(v)
    return None if len(tiers) == 1 else " < ".join(" ≈ ".join(t) for t in tiers)


def verdict_box(groups: list[Group], chosen=None, metric: str = "best val loss", target=None, defaults=None) -> Box:
    """One row per factor value against its baseline, with the effect at each setting of the other factors."""
    header = [
        "factor",
        "compared",
        f"Δ {metric} [95% CI, this comparison alone]{unit_text(metric)}",
        "verdict (Holm-adjusted over the box)",
        "per setting of the other factors",
        "interval",
    ]
    family = comparisons(groups, chosen, metric, target, defaults)
    rows, ranks = [], []
    for key, base in baselines(groups, chosen).items():
        values = factor_values(groups)[key]
        for value in values:
            if value != base:
                rows.append(_row(family[(key, value, base)]))
        # the pairs a ranking needs are in the Holm family too: every comparison the box adjusts is shown
        others = [v for v in values if v != base]
        for a, b in combinations(others, 2) if len(values) > 2 else ():
            rows.append(_row(family[(key, a, b)], " (for the ranking)"))
        if len(values) > 2 and (r := ranking(family, key, values, base)):
            ranks.append(f"`{key}`, lower {metric} first: {r}")
    return Box(header, rows, ranks, len(family), _no_verdict(groups))


def _shown(c: Contrast) -> str:
    return numbers.interval(c.diff, c.low, c.high) if c.diff is not None else "—"


def _row(e: Effect, role: str = "") -> list[str]:
    per = "; ".join(f"{label}: {_shown(c)}" for label, c in e.per_setting) or "— (one setting)"
    how = e.pooled.how + (f"; p {e.pooled.p:.2g} (Holm {e.p_holm:.2g})" if e.p_holm is not None else "")
    if e.pooled.how.startswith("paired, 2 seeds") and e.pooled.low is not None:
        how += "; 2 seeds: 1 degree of freedom (t = 12.7), so the interval is wide"
    if e.left_out:
        more = ", ..." if len(e.left_out) > 2 else ""
        how += f"; left out: {len(e.left_out)} runs ({', '.join(e.left_out[:2])}{more})"
    word = e.word + (f"; depends on the setting: {e.note}" if e.note and not e.failed else "")
    return [
        e.key,
        f"{e.value} − {e.base}{role}",
        _shown(e.pooled),
        word,
        per,
        how,
    ]  # the answer first, its workings after


def _no_verdict(groups: list[Group]) -> str | None:
    """The box's answer when every run with an outcome got stuck or diverged: their losses compare nothing."""
    judged = [r for g in groups for r in g.runs if r.outcome is not None]
    if not judged or any(r.outcome not in ("stuck", "diverged") for r in judged):
        return None
    return (
        f"No verdict can be made: every run got stuck or diverged ({outcome_counts(judged)}), so no value of any "
        "factor learned anything to compare (train longer, or at another learning rate)."
    )


def verdict_lines(groups: list[Group], metric: str = "best val loss") -> list[str]:
    """The verdict box in a few console lines (the sweep's closing leaderboard)."""
    if len(groups) < 2:
        return []
    box = verdict_box(groups, None, metric)
    if box.no_verdict:
        return [box.no_verdict]
    unit = UNITS.get(metric, "")
    lines = [f"{box.comparisons} comparisons, Holm-adjusted together; the seed is the unit"]
    lines += [f"{r[0]}: {r[1]}: {r[2]}{' ' + unit if unit else ''}, {r[3]} ({r[5].split('; p ')[0]})" for r in box.rows]
    return lines + [r.replace("`", "") for r in box.ranks]


def leaderboard(groups: list[Group], metric: str = "best val loss", n: int = 5) -> list[str]:
    """The best ``n`` groups by mean ``metric`` (mean ± std over seeds)."""
    get = _value_fn(metric, None, {})
    scored = []
    for g in groups:
        vals = _values(g, get)
        if vals:
            sd = statistics.stdev(vals) if len(vals) > 1 else None
            scored.append(
                (statistics.fmean(vals), g.label, numbers.pm(statistics.fmean(vals), sd), outcome_counts(g.runs))
            )
    scored.sort()
    return [f"{i + 1}. {label}: {shown} ({what})" for i, (_, label, shown, what) in enumerate(scored[:n])]
