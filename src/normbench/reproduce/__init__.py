"""``python -m normbench reproduce``: a verdict on each of the normalization papers' claims.

Each claim is data (``conf/claims/<id>.yaml``, :mod:`.claims`): its sweep per scale, the metric,
the direction, the threshold and the paper. :mod:`.runner` runs or reuses the sweep (a Hydra
multirun per grid, any launcher), :mod:`.measure` and :mod:`.verdict` apply the rule of
docs/claims.md, and the claim directory gets ``verdict.json``, a report opening with the
verdict, and ``claim.png``.
"""

from __future__ import annotations

import sys
import textwrap
from dataclasses import replace

from normbench.claims.registry import SCALES, claim_ids, load_claim
from normbench.claims.summary import fmt, verdict_line
from normbench.errors import ConfigError, error
from normbench.reproduce.ladders.duration import NAMES, RATIOS, run_duration
from normbench.reproduce.ladders.lr import NAME, run_lr_ladder
from normbench.reproduce.ladders.scale import ladder_name, run_ladder
from normbench.reproduce.request import OPTIONS, Request, parse, spelled_default
from normbench.reproduce.runner import reproduce
from normbench.reproduce.store import tally_line

_USAGE = """usage: python -m normbench reproduce {{--list | ID | all}} [scale={scales}] [seeds=N] [out=DIR]
                                   [min_seeds=N] [ladder=true] [ladder_param=mup|sp] [duration=ladder|branch]
                                   [rungs=R,R,..] [lr=ladder] [jobs=N] [bench=RxS|off] [--dry-run] [--no-run]
                                   [Hydra overrides, hydra/launcher=...]

  --list      one line per claim: id, the claim in words, the paper
  ID | all    run (or reuse) the claim's sweep and print its verdict; writes DIR/ID/verdict.json
              and DIR/ID/report.md (default DIR: {out})
  --dry-run   print the sweeps that would run, run nothing
  --no-run    launch nothing: judge and report the runs already there (unfinished ones count as such)
  ladder=true the sweep at 3 model widths (d_model 64/128/256, or the claim's own rungs): DIR/ID/ladder.json
              and DIR/ID/ladder.png, the effect against the size (reproduce/ladders/scale.py); under muP with
              the claim's LR transferred (docs/mup.md), or ladder_param=sp: one LR, ladder_sp.{{json,png}}
  duration=ladder
              the sweep at 1, 5 and 20 tokens per parameter (the top rung is the verdict's own sweep):
              DIR/ID/duration.json and DIR/ID/duration.png, the effect against the length
              (reproduce/ladders/duration.py)
  duration=branch
              the same from one warmup-stable-decay trunk with a 20% cooldown branched off at each shorter
              rung: DIR/ID/duration_branch.json and .png
  rungs=R,R,.. the duration ladder's tokens per parameter (default {ratios}, or the claim's own)
  lr=ladder   the sweep at 1/3x, 1x and 3x the claim's LR (the 1x rung is the verdict's own sweep):
              DIR/ID/lr_ladder.json and DIR/ID/lr_ladder.png, the effect against the LR (reproduce/ladders/lr.py);
              refused for a claim that sweeps or tunes optim.lr (no one LR to move)
  jobs=N      run each sweep's jobs N at a time, one torch thread each (Hydra's joblib launcher,
              hydra/launcher=joblib hydra.launcher.n_jobs=N, and OMP_NUM_THREADS=1): jobs=2 keeps both
              cores of a 2-core machine busy; finished runs are reused and unfinished ones resumed as ever
  scale=quick the claim's 200-step sweep (about 1 token per parameter): quick, and not the verdict
  bench={bench}  the timing tests (tokens/s, seconds to target) from a paired benchmark of the two sides in
              one process: {rounds} interleaved rounds of {steps} steps per side (claims/benchmark.py); bench=off:
              none, and those tests are reported, not judged
{defaults}
"""


def _usage() -> str:
    """The help text, its defaults written from :class:`.request.Request`'s (their one home)."""
    given = {key: spelled_default(key) for key in OPTIONS}
    own = [f"{key}=" for key, value in given.items() if value is None]
    defaults = " ".join(f"{key}={value}" for key, value in given.items() if value is not None)
    line = f"defaults: {defaults}; {' and '.join(own)}: the claim's own"
    bench = Request.bench
    return _USAGE.format(
        scales="|".join(SCALES),
        out=given["out"],
        ratios=",".join(f"{r:g}" for r in RATIOS),
        bench=given["bench"],
        rounds=bench.rounds,
        steps=bench.steps,
        defaults=textwrap.fill(line, 110, initial_indent="  ", subsequent_indent="              "),
    )


USAGE = _usage()


def list_claims() -> list[str]:

    lines = []
    for cid in claim_ids():
        c = load_claim(cid)
        extra = f" [cannot run yet: {c.requires}]" if c.requires else ""
        lines.append(f"{cid:<17} {c.claim} ({c.paper}){extra}")
    return lines


def main(argv: list[str]) -> int:

    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    try:
        if argv[0] == "--list":
            print("\n".join(list_claims()))
            return 0
        req = parse(argv)
        claims = [load_claim(cid) for cid in (claim_ids() if req.ids == ("all",) else req.ids)]
    except ConfigError as exc:
        return error(str(exc))
    code, tally = 0, [] if req.dry_run and len(claims) > 1 else None
    for c in claims:  # a claim's bad input is reported, and the next claim still runs
        try:
            result = _run_claim(c, req, tally)
        except ConfigError as exc:
            error(str(exc))
            code = 2
            continue
        if result is not None:
            print(verdict_line(result))
            where = req.out / c.id
            print(f"normbench: {where / 'verdict.json'}, report {where / 'report.md'}")
    if tally:  # the whole suite: each distinct training counted once (reproduce/store.py)
        print(f"normbench: {' '.join(req.ids) if req.ids != ('all',) else 'all'}: {tally_line(tally)}")
    sys.stdout.flush()
    return code


def _run_claim(claim, req: Request, tally: list | None = None) -> dict | None:
    """The claim's verdict from its sweep, run or reused (None on a dry run); with a ladder (ladder=true,
    duration=, lr=ladder) that ladder instead, printed rung by rung."""

    if req.kind is None:
        return reproduce(claim, req, tally=tally)
    # A ladder's rungs have always run the timing tests' benchmark at its default, whatever bench= says; kept so
    # here (issue 54 changes no behaviour), the one place to change it.
    ladder = replace(req, bench=Request.bench)
    {"duration": _duration, "ladder": _ladder, "lr": _lr_ladder}[req.kind](claim, ladder)
    return None


def _duration(claim, req: Request) -> None:

    result = run_duration(claim, req)
    if result is None:
        return
    for r in result["rungs"]:
        print(
            f"{claim.id} {r['tokens_per_param']:g} tokens per parameter ({r['steps']} steps): {r['verdict']} "
            f"({_tests_line(r)})"
        )
    name = NAMES[req.duration]
    where = req.out / claim.id
    seconds = f"{result['run_time_s']:.0f} s of runs"
    print(f"normbench: {where / (name + '.json')}, figure {where / (name + '.png')} ({seconds})")


def _tests_line(rung: dict) -> str:

    cis = [t["ci"] or (None, None) for t in rung["tests"]]
    return "; ".join(
        f"{t['name']}: {t['verdict']} {fmt(t['effect'])} [{fmt(lo)}, {fmt(hi)}]"
        for t, (lo, hi) in zip(rung["tests"], cis)
    )


def _ladder(claim, req: Request) -> None:

    ladder = run_ladder(claim, req)
    if ladder is None:
        return
    for r in ladder["rungs"]:
        print(f"{claim.id} d_model {r['d_model']}, {r['n_layer']} blocks: {r['verdict']} ({_tests_line(r)})")
    where = req.out / claim.id / ladder_name(req.ladder_param)
    print(f"normbench: {where}.json, figure {where}.png ({ladder['run_time_s']:.0f} s of runs)")


def _lr_ladder(claim, req: Request) -> None:

    result = run_lr_ladder(claim, req)
    if result is None:
        return
    for r in result["rungs"]:
        print(f"{claim.id} lr {r['lr']:.4g} ({r['factor']:g}x): {r['verdict']} ({_tests_line(r)})")
    where = req.out / claim.id / NAME
    print(f"normbench: {where}.json, figure {where}.png ({result['run_time_s']:.0f} s of runs)")
