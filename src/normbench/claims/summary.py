"""The claim's page (report.md and report.html, from the same blocks): the claim and its paper, the verdict
naming the test(s) it comes from, the claim's figure, a table of every test, the runs and the commit; then
the report package's tables and figures for its runs, its verdict box taking the claim's baseline, so every
effect on the page is group − baseline. Effects and means are rounded to their interval's precision
(:mod:`normbench.analysis.numbers`)."""

from __future__ import annotations

import math
import os
from pathlib import Path

from normbench.analysis import numbers
from normbench.claims import verdict as V
from normbench.claims.figure import METRIC_WORDS, metric_words, side_name
from normbench.claims.figure import caption as figure_caption
from normbench.errors import ConfigError
from normbench.report import build_report


def fmt(x, spec: str = ".4g") -> str:
    return "—" if x is None else format(x, spec) if isinstance(x, (int, float)) else str(x)


def deciding(result: dict) -> list[dict]:
    """The tests the claim's verdict comes from (:func:`.verdict.combine`): every judged test when it HOLDS
    (each had to), else the judged tests whose own verdict is the claim's (one that does not hold is enough)."""
    judged = [t for t in result["tests"] if not t.get("informative")] or result["tests"]
    return [t for t in judged if t["verdict"] == result["verdict"]] or judged


def sides(t: dict) -> str:
    """``RMSNorm − LayerNorm``: the effect's sign convention, group − baseline, in words."""
    labels = list(t["groups"])
    base = side_name(labels[1]) if len(labels) > 1 else "the fixed value"
    return f"{side_name(labels[0])} − {base}"


def _decimals(t: dict) -> int | None:
    ci = t.get("ci") or [None, None]
    if None in ci or not all(math.isfinite(c) for c in ci) or ci[1] <= ci[0]:
        return None
    return numbers.spread_decimals((ci[1] - ci[0]) / 2)


def effect_text(t: dict) -> str:
    """``+0.004 [−0.006, +0.014]`` at the interval's precision; a log ratio also as a ratio; grid steps for
    a largest-LR test."""
    if t.get("effect") is None:
        return "no value"
    if t["kind"] == "largest_lr":
        return f"{t['effect']:+d} grid steps"
    ci = t.get("ci") or [None, None]
    text = numbers.interval(t["effect"], ci[0], ci[1], ".3g")
    if t.get("transform") == "log":
        ratio = [math.exp(x) for x in (t["effect"], *ci) if x is not None]
        shown = numbers.interval(*ratio, ".3g").replace("+", "") if len(ratio) == 3 else f"{ratio[0]:.3g}"
        text = f"log ratio {text}, ratio ×{shown}"
    return text


def rule_text(t: dict) -> str:
    if t["kind"] == "on_par":
        lo, hi = t["threshold"]
        return f"band [{lo:+g}, {hi:+g}]"
    arrow = {"higher": "≥ +", "lower": "≤ −"}.get(t.get("direction") or "", "±")
    return f"{arrow}{t['threshold']:g}" if t.get("threshold") is not None else "—"


def over_text(t: dict, n_seeds: int) -> str:
    """What a test's interval is over: the seeds (the independent replicate), or, for a timing test decided by
    the paired benchmark, its rounds, with the load the machine had while they ran."""
    bench = t.get("benchmark")
    if not isinstance(bench, dict):
        return f"{n_seeds} seeds"
    plan, load = bench.get("plan") or {}, bench.get("load") or {}
    rounds = f"{plan.get('rounds', '?')} paired benchmark rounds of {plan.get('steps', '?')} steps per side"
    before, after = (load.get("loadavg_before") or [None])[0], (load.get("loadavg_after") or [None])[0]
    if before is None or after is None:
        return f"{rounds} (the machine's load not recorded), not seeds"
    cores = f" on {load['cpu_count']} cores" if load.get("cpu_count") else ""
    return f"{rounds} at load {before:.1f} → {after:.1f}{cores}, not seeds"


def deciding_over(result: dict) -> str:
    """What the deciding tests' intervals are over, once each (``3 seeds``; a benchmark's rounds and load)."""
    return "; ".join(dict.fromkeys(over_text(t, result["n_seeds"]) for t in deciding(result)))


def protocol_text(result: dict) -> str | None:
    """The page's **Protocol** line where the runs are not the claim's verdict protocol: a scale other than cpu
    (quick is the pipeline's smoke test), the command's overrides, fewer or more seeds than the claim's."""
    p = result.get("protocol") or {}
    changes = [f"`{o}`" for o in p.get("overrides") or []]
    if p.get("seeds") is not None and p.get("seeds") != p.get("declared_seeds"):
        changes.append(f"`seeds={p['seeds']}` (the claim declares {p.get('declared_seeds')})")
    scale = result.get("scale")
    if not changes and scale == "cpu":
        return None
    parts = []
    if scale != "cpu":
        parts.append(
            f"scale={scale} is not the verdict's protocol (scale=cpu: the papers' length and step size)"
            + ("; quick is the pipeline's smoke test" if scale == "quick" else "")
        )
    if changes:
        parts.append(f"the command changed the claim's protocol: {', '.join(changes)}")
    return f"**Protocol changed**: {'; '.join(parts)}. Read this verdict as one of these runs, not of the claim."


def verdict_line(result: dict) -> str:
    """The claim's verdict in one line (the console's and the page's), naming the test(s) that decide it."""
    tests = deciding(result)
    which = "; ".join(
        f"{t['name']}: {t['verdict']}, {metric_words(t['metric'])} {sides(t)} {effect_text(t)}, {rule_text(t)}"
        for t in tests
    )
    how = f"all {len(tests)} judged tests hold:" if len(tests) > 1 and result["verdict"] == V.HOLDS else "decided by"
    line = f"{result['claim']}: {result['verdict']} at scale={result['scale']}, {how} {which}; {deciding_over(result)}"
    return line + (f" ({result['reason']})" if result.get("reason") else "")


def _sides_cell(t: dict) -> str:
    """Each side's mean (at the interval's precision), value count and outcomes; what tuning chose."""
    d = _decimals(t) if t.get("transform") != "log" else None  # a log ratio's interval says nothing of the means'
    out = []
    for g, v in t["groups"].items():
        mean = "—" if v["mean"] is None else numbers.at(v["mean"], d) if d is not None else f"{v['mean']:.4g}"
        outcomes = ", ".join(f"{n} {k}" for k, n in sorted(v["outcomes"].items()))
        out.append(f"{side_name(g)}: mean {mean} over {len(v['values'])} ({outcomes})")
    if tu := t.get("tuned"):  # each side at its own best value: say which, and what every value gave
        out.append(
            f"each side at its own best {tu['key']}: "
            + "; ".join(
                f"{side_name(g)} at {tu['chosen'][g]} (tried: "
                + ", ".join(
                    f"{v}: {', '.join(f'{n} {k}' for k, n in sorted(c.items()))}"
                    for v, c in sorted(tu["tried"][g].items())
                )
                + ")"
                for g in tu["chosen"]
            )
        )
    return "; ".join(out)


def test_lines(result: dict) -> list[str]:
    """One line per test (verdict, effect group − baseline, rule, sides), as the page's table has them."""
    return [" ".join(f"{h}: {c}" for h, c in zip(TEST_HEADER, row)) for row in _test_rows(result)]


TEST_HEADER = ["test", "verdict", "effect, group − baseline [95% CI]", "rule", "sides"]
TESTS_CAPTION = (
    "Every test of the claim: its verdict, the effect (group − baseline) with its 95% interval and what the "
    "interval is over, the rule the verdict applies, and each side's mean."
)


def _test_rows(result: dict) -> list[list[str]]:
    rows = []
    for t in result["tests"]:
        note = " (reported, not judged)" if t.get("informative") else ""
        verdict = f"**{t['verdict']}**" + (f": {t['reason']}" if t.get("reason") else "")
        how = t.get("interval") if not isinstance(t.get("benchmark"), dict) else None  # the rounds say it
        over = f"{how + ', ' if how else ''}over {over_text(t, result['n_seeds'])}"
        effect = f"{metric_words(t['metric'])}, {sides(t)}: {effect_text(t)} ({over})"
        rows.append([f"{t['name']}{note} ({t['kind']})", verdict, effect, rule_text(t), _sides_cell(t)])
    return rows


def claim_blocks(result: dict, runs_dir: Path, formats=("pdf", "svg")) -> list[tuple]:
    """The page's top: claim and paper, verdict, figure, tests, runs and commit (the report's blocks)."""
    tests = deciding(result)
    decided = ", ".join(f"“{t['name']}”" for t in tests)
    how = f"every judged test holds ({decided})" if result["verdict"] == V.HOLDS else f"decided by {decided}"
    effects = "; ".join(
        f"{metric_words(t['metric'])}, {sides(t)}: {effect_text(t)} (rule {rule_text(t)})" for t in tests
    )
    reason = f" {result['reason'][0].upper()}{result['reason'][1:]}." if result.get("reason") else ""
    caption = figure_caption(result, ", ".join(f"`claim.{e}`" for e in formats))
    return [
        ("p", f"**Paper**: {result['paper']}."),
        (
            "p",
            f"**Verdict: {result['verdict']}** at scale={result['scale']}, {how}: {effects}; "
            f"{deciding_over(result)}.{reason}",
        ),
        *([("p", text)] if (text := protocol_text(result)) else []),
        *([("p", mode_text(result["mode"]))] if result.get("mode") else []),
        (
            "img",
            "claim.png",
            f"the claim's tests: each side's values by seed, its mean and the threshold "
            f"({', '.join(METRIC_WORDS.get(t['metric'], t['metric']) for t in result['tests'])})",
            caption,
        ),
        ("h", 2, "Tests"),
        ("table", TEST_HEADER, _test_rows(result), TESTS_CAPTION),
        (
            "p",
            f"**Runs**: `{runs_dir}`, {result.get('n_runs', '—')} runs, their wall-clock total "
            f"{fmt(result.get('run_time_s'))} s; commit `{result.get('commit')}`; every number is in "
            "`verdict.json` beside this page. Below: the report of these runs, its verdict box against the "
            "claim's baseline (effects group − baseline, as above).",
        ),
    ]


def mode_text(mode: dict) -> str:
    """The execution mode the runs trained in, and why: ``**Mode**: fp32, compiled (the claims' mode on a CPU
    without native bf16 products) ...``."""
    form = f"{mode['precision']}{', attention fp32' if mode.get('attn_fp32') and mode['precision'] != 'fp32' else ''}"
    compiled = {True: "compiled", False: "eager"}.get(mode.get("compile"), f"compile={mode.get('compile')}")
    cpu = "with" if mode.get("native_bf16") else "without"
    why = (
        f"the claims' mode on a CPU {cpu} native bf16 products"
        if mode.get("cpu_mode") == mode["precision"]
        else "set by the claim or the command, not the claims' mode of this CPU"
    )
    return (
        f"**Mode**: {form}, {compiled} ({why}). The other mode (bf16 with fp32 attention on a CPU with native bf16, "
        "fp32 on one without) gave the same verdicts where both were run (docs/claims.md, “bf16 against fp32”); "
        "the store never serves a run of one mode to a claim in the other."
    )


def claim_baseline(result: dict) -> str | None:
    """``norm=layernorm``: the setting the deciding test's baseline differs from its group in (the report's
    ``--baseline``, so its verdict box has the claim's sign); None for a fixed-value baseline."""
    t = deciding(result)[0]
    labels = list(t["groups"])
    if len(labels) < 2:
        return None
    group = dict(item.partition("=")[::2] for item in labels[0].split())
    base = dict(item.partition("=")[::2] for item in labels[1].split())
    return next((f"{k}={v}" for k, v in base.items() if group.get(k) != v), None)


def write_report(result: dict, runs_dir: Path, claim_dir: Path, runs: list | None = None) -> Path:
    """report.md/.html in ``claim_dir`` (which holds ``claim.png``): the claim's blocks, then its runs' report,
    over ``runs`` where given (the verdict's: runs another call left in ``runs_dir`` are not the claim's)."""
    title = f"Claim {result['claim']}: {result['statement']}"
    only = None if runs is None else {os.path.realpath(r.path) for r in runs}
    kw = dict(out=claim_dir, title=title, head=claim_blocks(result, runs_dir), only=only)
    try:
        md, _, _, _ = build_report([runs_dir], baseline=claim_baseline(result), **kw)
    except ConfigError:  # the runs are not grouped by that key (one group): the report's own baselines
        md, _, _, _ = build_report([runs_dir], **kw)
    return md
