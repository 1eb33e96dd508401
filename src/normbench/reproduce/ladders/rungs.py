"""The ladders' one loop: each ladder a transform from the claim's plan to its rungs, which :func:`climb` runs.

A ladder runs one claim's sweep (its fixed overrides, seeds and tests) at several settings: model sizes
(:mod:`.scale`), LRs (:mod:`.lr`) or training lengths (:mod:`.duration`). Each of those modules keeps only its
rule: a function of (the claim, the request, the claim's jobs composed once: :func:`.plan.start`) that returns a
:class:`Ladder`, its :class:`Rung` values (each one's overrides, directory, log line and fields in the ladder's
JSON) with the fields the JSON adds and the figure's options. :func:`climb` composes the jobs once, asks the
rule for the ladder and climbs it: each rung is an ordinary ``reproduce`` call with the rung's overrides after the
request's (its own settings hash, so it resumes and is reused like any sweep; a rung that adds nothing is the
claim's own sweep), its plan derived from the composed jobs (:meth:`.plan.Plan.derived`); its entry is its
fields, its overrides, its verdict.json and :func:`ladder_rung`'s verdict, tests, run time and length. Nothing
more on a dry run; else ``<out>/<id>/<name>.json`` and ``<name>.png`` (:func:`write_ladder`; :func:`plot_ladder`
draws the effect against the rungs with its 95% interval, the threshold or band and zero).

Hand-written: a claim-level plan over ``reproduce`` calls; the runs are Hydra multiruns as everywhere.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from normbench.claims.figure import save_figure
from normbench.claims.registry import Claim
from normbench.reproduce import runner  # runner.reproduce read at each call: the tests put a fake in its place
from normbench.reproduce.plan import Plan, start

if TYPE_CHECKING:
    from normbench.reproduce.request import Request

TEST_KEYS = (  # each test's keys in a rung's entry
    "name",
    "kind",
    "verdict",
    "effect",
    "ci",
    "threshold",
    "direction",
    "transform",
    "interval",
    "n_seeds",
    "informative",
    "reason",
)


@dataclass(frozen=True)
class Rung:
    """One rung: ``reproduce`` with ``extra`` after the request's overrides, into ``where``, after the line
    ``normbench: <id>: <label>``; ``fields`` open its entry in the ladder's JSON (``{"lr": .., "factor": ..}``)."""

    extra: tuple[str, ...]
    where: Path
    label: str
    fields: dict
    # The duration ladder's branches (duration.py): seeded from the trunk's checkpoints before they run, and timed
    # by their own seconds, not the trunk's they carry up to the fork.
    before: Callable[[Callable], float] | None = None  # (log) -> the seconds its runs carry from another rung's
    run_time: Callable[[float], float] | None = None  # (before's seconds) -> its run time, instead of the verdict's
    last: bool = False  # listed after the others though it runs before them (the branches' trunk: the top rung)


@dataclass(frozen=True)
class Ladder:
    """A claim's ladder: its rungs in the order they run, its files' stem (``<name>.json``, ``<name>.png``), the
    fields its JSON adds after the claim's (``header``) and its figure (``plot``: :func:`plot_ladder`'s options)."""

    name: str
    rungs: list[Rung]
    header: dict = field(default_factory=dict)
    plot: dict = field(default_factory=dict)
    intro: str | None = None  # a line before the rungs' (the LR ladder's: every rung's LR)
    overrides: bool = True  # each entry lists its rung's overrides (duration.json never has)


def climb(claim: Claim, req: Request, rule: Callable[[Claim, Request, Plan], Ladder], log=print) -> dict | None:
    """``rule``'s ladder for the claim, from its jobs composed once for the request's overrides: each rung's line
    and ``reproduce`` call in turn, then (not on a dry run) ``<out>/<id>/<name>.json``, an entry per rung, and its
    figure. Returns the JSON's content (None on a dry run)."""
    base = start(claim, req.scale, req.seeds, list(req.overrides), req.out)  # every rung's plan from these jobs
    ladder = rule(claim, req, base)
    if ladder.intro is not None:
        log(f"normbench: {claim.id}: {ladder.intro}")
    began, entries, last = time.perf_counter(), [], []
    for rung in ladder.rungs:
        shared = rung.before(log) if rung.before is not None and not req.dry_run else 0.0
        log(f"normbench: {claim.id}: {rung.label}")
        result = runner.reproduce(claim, req.rung(rung.extra, rung.where), log=log, base=base)
        if result is not None:
            (last if rung.last else entries).append(_entry(claim, rung, result, shared, ladder.overrides))
    if req.dry_run:
        return None
    rungs = [*entries, *last]
    doc = {
        "claim": claim.id,
        "statement": claim.claim,
        "scale": req.scale,
        **ladder.header,
        "rungs": rungs,
        "seconds": round(time.perf_counter() - began, 1),
        "run_time_s": round(sum(r["run_time_s"] for r in rungs), 1),
    }
    write_ladder(doc, req.out / claim.id, ladder.name, **ladder.plot)
    return doc


def _entry(claim: Claim, rung: Rung, result: dict, shared: float, overrides: bool) -> dict:
    entry = {
        **rung.fields,
        **({"overrides": list(rung.extra)} if overrides else {}),
        "verdict_json": str(rung.where / claim.id / "verdict.json"),
        **ladder_rung(result),
    }
    if rung.run_time is not None:
        entry["run_time_s"] = round(rung.run_time(shared), 1)
    return entry


def ladder_rung(result: dict) -> dict:
    """A rung's verdict, its tests (effect, interval, threshold per test), run time and length, from its result."""
    length = result.get("length") or {}
    reached = length.get("reached") or [None]
    return {
        "verdict": result["verdict"],
        "tests": [{k: t.get(k) for k in TEST_KEYS} for t in result["tests"]],
        "run_time_s": result.get("run_time_s") or 0.0,
        "steps": length.get("steps"),
        "tokens_per_param": reached[0],
    }


def write_ladder(ladder: dict, claim_dir: Path, name: str, **plot) -> None:
    """``<claim_dir>/<name>.json`` and ``<name>.png`` (:func:`plot_ladder` with ``plot``): any ladder's files."""
    claim_dir.mkdir(parents=True, exist_ok=True)
    (claim_dir / f"{name}.json").write_text(json.dumps(ladder, indent=1, default=str))
    plot_ladder(ladder, claim_dir / f"{name}.png", **plot)


def plot_ladder(
    ladder: dict,
    path: Path,
    x: str = "d_model",
    xlabel: str = "d_model",
    log_base: int = 2,
    title: str = "effect against model width",
) -> Path:
    """One panel per test: the effect against ``x`` (d_model; the duration ladder: tokens per parameter), log
    x, with its 95% interval, the threshold (or the on-par band) and zero; each point labelled with its verdict."""
    import matplotlib  # deferred (start-up time): matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deferred (start-up time): matplotlib

    rungs_ = ladder["rungs"]
    names = [t["name"] for t in rungs_[0]["tests"]] if rungs_ else []
    fig, axes = plt.subplots(1, max(len(names), 1), figsize=(4.4 * max(len(names), 1), 3.5), squeeze=False)
    for ax, name in zip(axes[0], names):
        pts = [(r[x], next(t for t in r["tests"] if t["name"] == name)) for r in rungs_]
        first = pts[0][1]
        for px, t in pts:
            if t["effect"] is None:
                continue
            ci = t.get("ci") or [None, None]
            if ci[0] is not None:
                ax.errorbar(
                    [px],
                    [t["effect"]],
                    yerr=[[t["effect"] - ci[0]], [ci[1] - t["effect"]]],
                    fmt="o",
                    color="C0",
                    capsize=4,
                )
            else:
                ax.plot([px], [t["effect"]], "o", color="C0")
            ax.annotate(
                t["verdict"].replace("DOES NOT HOLD", "NOT"),
                (px, t["effect"]),
                textcoords="offset points",
                xytext=(6, 4),
                fontsize=7,
            )
        line = [(px, t["effect"]) for px, t in pts if t["effect"] is not None]
        ax.plot([px for px, _ in line], [y for _, y in line], color="C0", alpha=0.4)
        ax.axhline(0, color="k", lw=0.8)
        _threshold_lines(ax, first)
        ax.set_xscale("log", base=log_base)
        ax.set_xticks([p for p, _ in pts], [f"{p:g}" for p, _ in pts])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # only the rungs are labelled
        ax.set_xlabel(xlabel, fontsize=8)
        ylabel = "effect" + (" (log ratio)" if first.get("transform") == "log" else "")
        ax.set_ylabel(ylabel + (f", {first['interval']} 95% CI" if first.get("interval") else ""), fontsize=8)
        ax.set_title(name + (" (reported)" if first.get("informative") else ""), fontsize=9)
    if x != "d_model":  # the duration and LR ladders, through the same drawing
        return save_figure(fig, path, f"{ladder['claim']} ({ladder['scale']}): {title}")
    how = "muP, LR transferred from d_base" if ladder.get("param", "sp") == "mup" else "SP, one LR"
    return save_figure(fig, path, f"{ladder['claim']} ({ladder['scale']}, {how}): {title}; {_lengths(rungs_)}")


def _lengths(rungs_: list[dict]) -> str:
    """What each rung trained, so that a width trend is not read as a length trend."""
    steps = {r.get("steps") for r in rungs_}
    ratios = [r.get("tokens_per_param") for r in rungs_]
    per = " / ".join(f"{t:.2g}" for t in ratios) if all(t is not None for t in ratios) else None
    if len(steps) == 1 and None not in steps:
        return f"{steps.pop()} steps at every width" + (f" ({per} tokens per parameter)" if per else "")
    return f"{per} tokens per parameter" if per else "the claim's length per rung"


def _threshold_lines(ax, t: dict) -> None:
    thr = t.get("threshold")
    if isinstance(thr, list):  # on_par band
        ax.axhspan(thr[0], thr[1], color="green", alpha=0.12, label="on-par band")
    elif thr:
        sign = 1 if t.get("direction") == "higher" else -1
        ax.axhline(sign * thr, color="green", ls="--", lw=1, label="claimed threshold")
    ax.legend(fontsize=7, loc="best")
