"""The scale ladder: one claim's sweep at several model sizes, so a verdict comes with its trend.

A claim judged at one tiny size says little about the papers' scale; how its effect moves with the
size says more. ``normbench reproduce ID ladder=true`` runs the claim's sweep (the same fixed
overrides, seeds and tests) at each rung, by default ``model.d_model`` 64, 128 and 256 with the
claim's own depth and LR. By default (``ladder_param=mup``) the rungs run under muP (``model.param=mup``,
model/mup.py, docs/mup.md) with the claim's own width as d_base and its d_head held (the head count grows),
so the LR the claim set at its own width transfers; ``ladder_param=sp`` is the standard parametrization with
the claim's heads, where the init follows the width (``model.init_std: auto``, docs/init.md) but the same
AdamW LR takes a larger effective step at every wider rung. A claim file can set its own rungs under
``scales.<scale>.ladder`` (a list of override lists, e.g. depth with width for a depth claim).

Each rung is an ordinary ``reproduce`` call with the rung's overrides (its own settings hash, so it
resumes and is reused like any claim sweep); the rung equal to the claim's own size is the claim's
own sweep. ``<out>/<id>/ladder.json`` holds each rung's verdict, effect and interval per test, and
``ladder.png`` draws the effect against the size with its interval, the threshold (or band) and zero
(under ``ladder_param=sp``: ``ladder_sp.json`` and ``ladder_sp.png``, and rung directories without ``-mup``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

from normbench.claims.figure import save_figure
from normbench.claims.registry import Claim

if TYPE_CHECKING:
    from normbench.reproduce.request import Request

WIDTHS = (64, 128, 256)


def mup_overrides(width: int, base_width: int, head_dim: int) -> list[str]:
    """A rung's muP keys: d_base is the claim's own width, d_head its own (model/mup.py's rule)."""
    return [
        f"model.n_head={width // head_dim}",
        "model.param=mup",
        f"model.mup_base_width={base_width}",
        f"model.mup_head_dim={head_dim}",
    ]


def rungs(claim: Claim, scale: str, base_width: int) -> list[list[str]]:
    """The rungs' overrides: the claim's ``ladder`` if it has one, else the default widths; the rung at
    the claim's own width gets no override (it is the claim's own sweep)."""
    declared = claim.sweep(scale).ladder
    if declared is not None:
        return [list(r) for r in declared]
    return [[] if w == base_width else [f"model.d_model={w}"] for w in WIDTHS]


def _size(overrides: list[str], base: dict) -> dict:
    """d_model and n_layer a rung resolves to (its overrides over the claim's composed config)."""
    size = dict(base)
    for o in overrides:
        key, _, value = o.partition("=")
        if key in ("model.d_model", "model.n_layer"):
            size[key.split(".")[1]] = int(value)
    return size


def run_ladder(claim: Claim, req: Request, log=print) -> dict | None:
    """The claim's sweep at each rung (the request's scale, seeds and overrides, ``req.ladder_param``'s
    parametrization); ladder.json and its figure (None on a dry run)."""
    from normbench.reproduce.plan import start  # deferred (start-up time): hydra, numpy
    from normbench.reproduce.runner import reproduce  # deferred (start-up time): hydra, numpy
    from normbench.reproduce.shared import compose  # deferred (start-up time): hydra, numpy

    scale, out, param = req.scale, req.out, req.ladder_param
    plan = start(claim, scale, req.seeds, list(req.overrides), out)  # every rung's plan from these jobs: composed once
    cfg = compose(claim, claim.settings(scale, req.overrides), "(fixed settings)")  # the size every rung starts from
    base = {"d_model": int(cfg.model.d_model), "n_layer": int(cfg.model.n_layer)}
    head_dim = base["d_model"] // int(cfg.model.n_head)
    start, steps = time.perf_counter(), []
    for rung in rungs(claim, scale, base["d_model"]):
        size = _size(rung, base)
        if param == "mup" and size["d_model"] != base["d_model"]:  # the claim's own width is muP's d_base: as sp
            rung = [*rung, *mup_overrides(size["d_model"], base["d_model"], head_dim)]
        tag = "-mup" if param == "mup" else ""
        where = out if not rung else out / claim.id / "ladder" / f"d{size['d_model']}-L{size['n_layer']}{tag}"
        log(f"normbench: {claim.id}: ladder rung d_model {size['d_model']}, {size['n_layer']} blocks")
        result = reproduce(claim, req.rung(rung, where), log=log, base=plan)
        if result is not None:
            steps.append(
                {
                    **size,
                    "overrides": rung,
                    "verdict_json": str(where / claim.id / "verdict.json"),
                    **ladder_rung(result),
                }
            )
    if req.dry_run:
        return None
    ladder = {
        "claim": claim.id,
        "statement": claim.claim,
        "scale": scale,
        "param": param,
        "rungs": steps,
        "seconds": round(time.perf_counter() - start, 1),
        "run_time_s": round(sum(s["run_time_s"] for s in steps), 1),
    }
    write_ladder(ladder, out / claim.id, ladder_name(param))
    return ladder


def ladder_name(param: str) -> str:
    """The ladder's file stem: ``ladder`` under muP (the default), ``ladder_sp`` under SP."""
    return "ladder" if param == "mup" else f"ladder_{param}"


def ladder_rung(result: dict) -> dict:
    tests = [
        {
            k: t.get(k)
            for k in (
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
        }
        for t in result["tests"]
    ]
    length = result.get("length") or {}
    reached = length.get("reached") or [None]
    return {
        "verdict": result["verdict"],
        "tests": tests,
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
    if x != "d_model":  # the duration ladder, through the same drawing
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
