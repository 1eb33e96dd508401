"""The report's answer: for each factor the sweep varied, the effect of each value against a baseline value.

A factor is a grouping key (``arch``, ``norm``, ``optim.lr``, ...). Its baseline is the value
``--baseline KEY=VALUE`` names, else the config group's default (conf/config.yaml's defaults list:
``arch=pre_ln``, ``norm=rmsnorm``, ...) when the sweep ran it, else the first value the sweep ran.
The effect of a value is the mean difference of the metric from the baseline *within each setting of
the other factors* (e.g. ``post_ln`` minus ``pre_ln`` at each norm), pooled over those settings.

The interval is the rule ``reproduce`` uses (docs/claims.md; :func:`normbench.report.stats.interval`
with :func:`normbench.report.stats.seed_pairs`, which reproduce imports): paired over seeds when every
compared setting ran the same seeds on both sides (same seed, same data order and val batches), else
Welch's t-interval.
An interval that contains zero reads "no detectable difference". A ranking of a factor's values is
given only where the intervals separate them.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import yaml

from normbench.report import numbers
from normbench.report.loading import Group, Run
from normbench.report.stats import METRICS, interval, loss_pool, outcome_counts, seed_pairs, target_for

METRIC_NAMES = {k.replace(" ", "_"): k for k in METRICS}  # --metric best_val_loss -> "best val loss"
UNITS = {"best val loss": "nats", "final val loss": "nats", "steps to target": "steps", "seconds to target": "s"}


def metric_name(text: str) -> str:
    """``best_val_loss`` (or ``best val loss``) -> the metric's name; ConfigError naming the choices otherwise."""
    import difflib

    from normbench.errors import ConfigError

    key = text.strip().replace(" ", "_").replace("-", "_")
    if key in METRIC_NAMES:
        return METRIC_NAMES[key]
    near = difflib.get_close_matches(key, list(METRIC_NAMES), n=1)
    hint = f" (did you mean {near[0]}?)" if near else ""
    raise ConfigError(f"--metric {text} is not a metric{hint}; choose one of: {', '.join(METRIC_NAMES)}")


@dataclass
class Effect:
    """``value`` minus ``base`` of one factor, pooled over the settings of the other factors."""

    key: str
    value: str
    base: str
    diff: float | None = None
    low: float | None = None
    high: float | None = None
    how: str = ""  # "paired over 4 seed pairs", "Welch, 4 vs 4 runs", ...
    left_out: list[str] = field(default_factory=list)  # runs without a value (diverged, not reached, ...)

    @property
    def word(self) -> str:
        if self.diff is None:
            return "no value on one side"
        if self.low is None:
            return "no interval (needs 2 runs a side)"
        if self.low <= 0 <= self.high:
            return "no detectable difference"
        return f"{self.value} better (lower)" if self.high < 0 else f"{self.value} worse (higher)"

    @property
    def separated(self) -> bool:
        return self.low is not None and not (self.low <= 0 <= self.high)


def config_defaults() -> dict[str, str]:
    """The config groups' defaults (``arch: pre_ln``, ...), from conf/config.yaml's defaults list."""
    from normbench.config.files import config_dir

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
    fn = METRICS[metric]

    def value(run: Run):
        if run.status != "completed":  # diverged and unfinished runs have no loss to average (loss_pool)
            return None
        return fn(run, target_for(run, target, defaults or {}))

    return value


def effect(groups: list[Group], key: str, value: str, base: str, metric: str = "best val loss", target=None,
           defaults=None) -> Effect:  # fmt: skip
    """``value`` minus ``base`` of ``key``, within each setting of the other keys, pooled."""
    by_settings = {tuple(sorted(g.settings.items())): g for g in groups}
    get = _value_fn(metric, target, defaults)
    cells = []  # (group, its baseline group)
    for g in groups:
        if g.settings.get(key) == value:
            b = by_settings.get(tuple(sorted({**g.settings, key: base}.items())))
            if b is not None:
                cells.append((g, b))
    out = Effect(key, value, base)
    pairs = [seed_pairs(g.runs, b.runs, get, None) for g, b in cells]
    left = [r for g, b in cells for r in g.runs + b.runs if get(r) is None]
    out.left_out = [f"{r.name} ({r.outcome_label})" for r in left]
    if cells and all(pairs):
        xs = [x for p in pairs for x, _ in p]
        bs = [b for p in pairs for _, b in p]
        out.diff, ci = interval(xs, bs, paired=True)
        out.low, out.high = ci
        out.how = f"paired, {len(xs)} seed pairs"
        return out
    xs = [v for g, _ in cells for v in _values(g, get)]
    bs = [v for _, b in cells for v in _values(b, get)]
    if xs and bs:
        out.diff, ci = interval(xs, bs)
        out.low, out.high = ci
    out.how = f"Welch, {len(xs)} vs {len(bs)} runs" + ("" if cells else "; no setting ran both")
    return out


def _values(group: Group, get) -> list[float]:
    pool, _ = loss_pool(group)
    return [v for r in pool if (v := get(r)) is not None]


def ranking(groups: list[Group], key: str, base: str, metric: str, target=None, defaults=None) -> str | None:
    """``pre_ln < post_ln ≈ peri_ln``: the values by effect, ``<`` only where the interval between the
    neighbouring tiers separates them; None when no two values separate."""
    values = factor_values(groups)[key]
    eff = {v: (0.0 if v == base else effect(groups, key, v, base, metric, target, defaults).diff) for v in values}
    order = sorted((v for v in values if eff[v] is not None), key=lambda v: eff[v])
    if len(order) < 2:
        return None
    tiers: list[list[str]] = [[order[0]]]
    for v in order[1:]:
        vs = effect(groups, key, v, tiers[-1][0], metric, target, defaults)
        if vs.separated and vs.diff > 0:
            tiers.append([v])
        else:
            tiers[-1].append(v)
    if len(tiers) == 1:
        return None
    return " < ".join(" ≈ ".join(t) for t in tiers)


def verdict_rows(groups: list[Group], chosen=None, metric: str = "best val loss", target=None, defaults=None):
    """(header, rows, rankings) of the verdict box: one row per factor value against its baseline."""
    unit = UNITS.get(metric, "")
    header = ["factor", "compared", f"Δ {metric} [95% CI] ({unit})", "interval", "verdict"]
    rows, ranks = [], []
    for key, base in baselines(groups, chosen).items():
        for value in factor_values(groups)[key]:
            if value == base:
                continue
            e = effect(groups, key, value, base, metric, target, defaults)
            shown = numbers.interval(e.diff, e.low, e.high) if e.diff is not None else "—"
            note = f"; left out: {len(e.left_out)} runs ({', '.join(e.left_out[:2])}" if e.left_out else ""
            note += ", ...)" if len(e.left_out) > 2 else (")" if e.left_out else "")
            rows.append([key, f"{value} − {base}", shown, e.how + note, e.word])
        if len(factor_values(groups)[key]) > 2 and (r := ranking(groups, key, base, metric, target, defaults)):
            ranks.append(f"`{key}`, lower {metric} first: {r}")
    return header, rows, ranks


def verdict_lines(groups: list[Group], metric: str = "best val loss") -> list[str]:
    """The verdict box in a few console lines (the sweep's closing leaderboard)."""
    if len(groups) < 2:
        return []
    header, rows, ranks = verdict_rows(groups, None, metric)
    lines = [f"{r[0]}: {r[1]}: {r[2]} {UNITS.get(metric, '')}, {r[4]} ({r[3]})" for r in rows]
    return lines + [r.replace("`", "") for r in ranks]


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
