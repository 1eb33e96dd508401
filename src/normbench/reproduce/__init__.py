"""``python -m normbench reproduce``: a verdict on each of the normalization papers' claims.

Each claim is data (``conf/claims/<id>.yaml``, :mod:`.claims`): its sweep per scale, the metric,
the direction, the threshold and the paper. :mod:`.runner` runs or reuses the sweep (a Hydra
multirun per grid, any launcher), :mod:`.measure` and :mod:`.verdict` apply the rule of
docs/claims.md, and the claim directory gets ``verdict.json``, a report opening with the
verdict, and ``claim.png``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from normbench.errors import ConfigError, error

USAGE = """usage: python -m normbench reproduce {--list | ID | all} [scale=cpu|quick|gpu] [seeds=N] [out=DIR]
                                   [min_seeds=N] [ladder=true] [ladder_param=mup|sp] [duration=ladder|branch]
                                   [lr=ladder] [jobs=N] [bench=RxS|off] [--dry-run] [--no-run]
                                   [Hydra overrides, hydra/launcher=...]

  --list      one line per claim: id, the claim in words, the paper
  ID | all    run (or reuse) the claim's sweep and print its verdict; writes DIR/ID/verdict.json
              and DIR/ID/report.md (default DIR: outputs/reproduce)
  --dry-run   print the sweeps that would run, run nothing
  --no-run    launch nothing: judge and report the runs already there (unfinished ones count as such)
  ladder=true the sweep at 3 model widths (d_model 64/128/256, or the claim's own rungs): DIR/ID/ladder.json
              and DIR/ID/ladder.png, the effect against the size (reproduce/ladders/scale.py); under muP with
              the claim's LR transferred (docs/mup.md), or ladder_param=sp: one LR, ladder_sp.{json,png}
  duration=ladder
              the sweep at 1, 5 and 20 tokens per parameter (the top rung is the verdict's own sweep):
              DIR/ID/duration.json and DIR/ID/duration.png, the effect against the length
              (reproduce/ladders/duration.py)
  duration=branch
              the same from one warmup-stable-decay trunk with a 20% cooldown branched off at each shorter
              rung: DIR/ID/duration_branch.json and .png
  rungs=R,R,.. the duration ladder's tokens per parameter (default 1,5,20, or the claim's own)
  lr=ladder   the sweep at 1/3x, 1x and 3x the claim's LR (the 1x rung is the verdict's own sweep):
              DIR/ID/lr_ladder.json and DIR/ID/lr_ladder.png, the effect against the LR (reproduce/ladders/lr.py);
              refused for a claim that sweeps or tunes optim.lr (no one LR to move)
  jobs=N      run each sweep's jobs N at a time, one torch thread each (Hydra's joblib launcher,
              hydra/launcher=joblib hydra.launcher.n_jobs=N, and OMP_NUM_THREADS=1): jobs=2 keeps both
              cores of a 2-core machine busy; finished runs are reused and unfinished ones resumed as ever
  scale=quick the claim's 200-step sweep (about 1 token per parameter): quick, and not the verdict
  bench=5x10  the timing tests (tokens/s, seconds to target) from a paired benchmark of the two sides in
              one process: 5 interleaved rounds of 10 steps per side (claims/benchmark.py); bench=off:
              none, and those tests are reported, not judged
"""


def list_claims() -> list[str]:
    from normbench.claims.registry import claim_ids, load_claim

    lines = []
    for cid in claim_ids():
        c = load_claim(cid)
        extra = f" [cannot run yet: {c.requires}]" if c.requires else ""
        lines.append(f"{cid:<17} {c.claim} ({c.paper}){extra}")
    return lines


# This command's own options (any other key=value is a Hydra override for the runs), with their defaults.
OPTIONS = {
    "scale": "cpu",
    "seeds": None,
    "out": "outputs/reproduce",
    "min_seeds": "3",
    "ladder": "false",
    "duration": "false",
    "rungs": None,
    "ladder_param": "mup",
    "lr": "false",
    "jobs": "1",
    "bench": "5x10",
}


@dataclass
class _Request:
    """The command line: claim ids, this command's options, the Hydra overrides it passes on to the
    runs, and the two flags."""

    ids: list[str] = field(default_factory=list)
    opts: dict = field(default_factory=lambda: dict(OPTIONS))
    overrides: list[str] = field(default_factory=list)
    dry: bool = False
    launch: bool = True

    @property
    def seeds(self) -> int | None:
        return None if self.opts["seeds"] is None else int(self.opts["seeds"])


def main(argv: list[str]) -> int:
    from normbench.claims.registry import claim_ids, load_claim
    from normbench.claims.summary import verdict_line

    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    try:
        if argv[0] == "--list":
            print("\n".join(list_claims()))
            return 0
        req = _parse(argv)
        claims = [load_claim(cid) for cid in (claim_ids() if req.ids == ["all"] else req.ids)]
    except ConfigError as exc:
        return error(str(exc))
    code, tally = 0, [] if req.dry and len(claims) > 1 else None
    for c in claims:  # a claim's bad input is reported, and the next claim still runs
        try:
            result = _run_claim(c, req, tally)
        except ConfigError as exc:
            error(str(exc))
            code = 2
            continue
        if result is not None:
            print(verdict_line(result))
            where = Path(req.opts["out"]) / c.id
            print(f"normbench: {where / 'verdict.json'}, report {where / 'report.md'}")
    if tally:  # the whole suite: each distinct training counted once (reproduce/store.py)
        from normbench.reproduce.store import tally_line

        print(f"normbench: {' '.join(req.ids) if req.ids != ['all'] else 'all'}: {tally_line(tally)}")
    sys.stdout.flush()
    return code


def _parse(argv: list[str]) -> _Request:
    """Flags, this command's options, Hydra overrides and claim ids, each checked."""
    req = _Request()
    for a in argv:
        key, sep, value = a.partition("=")
        if a == "--dry-run":
            req.dry = True
        elif a == "--no-run":
            req.launch = False
        elif sep and key in req.opts:
            req.opts[key] = value
        elif sep:
            req.overrides.append(a)
        elif a.startswith("-"):
            raise ConfigError(f"unknown flag {a}; see `python -m normbench reproduce --help`")
        else:
            req.ids.append(a)
    _check_options(req.opts)
    if not req.ids:
        raise ConfigError("name a claim (or all); list them with --list")
    req.overrides += _launcher(int(req.opts["jobs"]), req.overrides)
    return req


def _launcher(jobs: int, overrides: list[str]) -> list[str]:
    """jobs=N (N > 1) as Hydra's joblib launcher running N jobs of a sweep at once (runner.train gives each
    one torch thread); another launcher the user names cannot also take jobs=."""
    if jobs == 1:
        return []
    named = [o for o in overrides if o.split("=", 1)[0] in ("hydra/launcher", "hydra.launcher.n_jobs")]
    if named:
        raise ConfigError(f"jobs={jobs} runs the sweeps through hydra/launcher=joblib; drop {named[0]} or jobs=")
    return ["hydra/launcher=joblib", f"hydra.launcher.n_jobs={jobs}"]


def _check_options(opts: dict) -> None:
    from normbench.claims.registry import SCALES

    if opts["scale"] not in SCALES:
        raise ConfigError(f"scale={opts['scale']} is not allowed; choose one of: {', '.join(SCALES)}")
    for key in ("seeds", "min_seeds", "jobs"):
        if opts[key] is not None and not (opts[key].isdigit() and int(opts[key]) >= (2 if key == "min_seeds" else 1)):
            raise ConfigError(f"{key}={opts[key]} must be a whole number (min_seeds >= 2)")
    if opts["ladder"] not in ("true", "false"):
        raise ConfigError(f"ladder={opts['ladder']} is not allowed; choose one of: true, false")
    if opts["ladder_param"] not in ("mup", "sp"):
        raise ConfigError(f"ladder_param={opts['ladder_param']} is not allowed; choose one of: mup, sp")
    if opts["duration"] not in ("false", "ladder", "branch"):
        raise ConfigError(f"duration={opts['duration']} is not allowed; choose one of: ladder, branch, false")
    from normbench.claims.benchmark import parse_plan

    parse_plan(opts["bench"])
    if opts["rungs"] is not None:
        try:
            values = [float(r) for r in opts["rungs"].split(",")]
        except ValueError:
            values = []
        if not values or any(not v > 0 for v in values) or opts["duration"] == "false":
            raise ConfigError(f"rungs={opts['rungs']} must be tokens per parameter (e.g. rungs=1,5,20) with duration=")
    if opts["lr"] not in ("false", "ladder"):
        raise ConfigError(f"lr={opts['lr']} is not allowed; choose one of: ladder, false (an LR itself is optim.lr=)")
    ladders = [k for k, off in (("ladder", "false"), ("duration", "false"), ("lr", "false")) if opts[k] != off]
    if len(ladders) > 1:
        raise ConfigError(f"{ladders[0]}= and {ladders[1]}= are two ladders; run them one at a time")


def _run_claim(claim, req: _Request, tally: list | None = None) -> dict | None:
    """The claim's verdict from its sweep, run or reused (None on a dry run); with ladder=true its
    ladder instead, printed rung by rung."""
    from normbench.reproduce.runner import reproduce

    opts = req.opts
    if opts["duration"] != "false":
        _duration(claim, opts, req.seeds, req.overrides, req.dry, req.launch)
        return None
    if opts["ladder"] == "true":
        _ladder(claim, opts, req.seeds, req.overrides, req.dry, req.launch)
        return None
    if opts["lr"] == "ladder":
        _lr_ladder(claim, opts, req.seeds, req.overrides, req.dry, req.launch)
        return None
    return reproduce(claim, opts["scale"], req.seeds, req.overrides, Path(opts["out"]), int(opts["min_seeds"]),
                     req.dry, launch=req.launch, tally=tally, bench=opts["bench"])  # fmt: skip


def _duration(claim, opts: dict, seeds, overrides: list[str], dry: bool, launch: bool) -> None:
    from normbench.reproduce.ladders.duration import run_duration

    rungs = [float(r) for r in opts["rungs"].split(",")] if opts["rungs"] else None
    result = run_duration(claim, opts["scale"], seeds, overrides, Path(opts["out"]), int(opts["min_seeds"]),
                          opts["duration"], dry, launch, rungs=rungs)  # fmt: skip
    if result is None:
        return
    for r in result["rungs"]:
        print(f"{claim.id} {r['tokens_per_param']:g} tokens per parameter ({r['steps']} steps): {r['verdict']} "
              f"({_tests_line(r)})")  # fmt: skip
    name = "duration" if opts["duration"] == "ladder" else "duration_branch"
    where = Path(opts["out"]) / claim.id
    seconds = f"{result['run_time_s']:.0f} s of runs"
    print(f"normbench: {where / (name + '.json')}, figure {where / (name + '.png')} ({seconds})")


def _tests_line(rung: dict) -> str:
    from normbench.claims.summary import fmt

    cis = [t["ci"] or (None, None) for t in rung["tests"]]
    return "; ".join(f"{t['name']}: {t['verdict']} {fmt(t['effect'])} [{fmt(lo)}, {fmt(hi)}]"
                     for t, (lo, hi) in zip(rung["tests"], cis))  # fmt: skip


def _ladder(claim, opts: dict, seeds, overrides: list[str], dry: bool, launch: bool) -> None:
    from normbench.reproduce.ladders.scale import ladder_name, run_ladder

    ladder = run_ladder(claim, opts["scale"], seeds, overrides, Path(opts["out"]), int(opts["min_seeds"]), dry,
                        launch=launch, param=opts["ladder_param"])  # fmt: skip
    if ladder is None:
        return
    for r in ladder["rungs"]:
        print(f"{claim.id} d_model {r['d_model']}, {r['n_layer']} blocks: {r['verdict']} ({_tests_line(r)})")
    where = Path(opts["out"]) / claim.id / ladder_name(opts["ladder_param"])
    print(f"normbench: {where}.json, figure {where}.png ({ladder['run_time_s']:.0f} s of runs)")


def _lr_ladder(claim, opts: dict, seeds, overrides: list[str], dry: bool, launch: bool) -> None:
    from normbench.reproduce.ladders.lr import NAME, run_lr_ladder

    result = run_lr_ladder(claim, opts["scale"], seeds, overrides, Path(opts["out"]), int(opts["min_seeds"]), dry,
                           launch)  # fmt: skip
    if result is None:
        return
    for r in result["rungs"]:
        print(f"{claim.id} lr {r['lr']:.4g} ({r['factor']:g}x): {r['verdict']} ({_tests_line(r)})")
    where = Path(opts["out"]) / claim.id / NAME
    print(f"normbench: {where}.json, figure {where}.png ({result['run_time_s']:.0f} s of runs)")
