"""``python -m normbench reproduce``: a verdict on each of the normalization papers' claims.

Each claim is data (``conf/claims/<id>.yaml``, :mod:`.claims`): its sweep per scale, the metric,
the direction, the threshold and the paper. :mod:`.runner` runs or reuses the sweep (a Hydra
multirun per grid, any launcher), :mod:`.measure` and :mod:`.verdict` apply the rule of
docs/claims.md, and the claim directory gets ``verdict.json``, a report opening with the
verdict, and ``claim.png``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from normbench.errors import ConfigError, error

USAGE = """usage: python -m normbench reproduce {--list | ID | all} [scale=cpu|gpu] [seeds=N] [out=DIR]
                                   [min_seeds=N] [ladder=true] [--dry-run] [--no-run]
                                   [Hydra overrides, hydra/launcher=...]

  --list      one line per claim: id, the claim in words, the paper
  ID | all    run (or reuse) the claim's sweep and print its verdict; writes DIR/ID/verdict.json
              and DIR/ID/report.md (default DIR: outputs/reproduce)
  --dry-run   print the sweeps that would run, run nothing
  --no-run    launch nothing: judge and report the runs already there (unfinished ones count as such)
  ladder=true the sweep at 3 model widths (d_model 64/128/256, or the claim's own rungs): DIR/ID/ladder.json
              and DIR/ID/ladder.png, the effect against the size (reproduce/ladder.py)
"""


def list_claims() -> list[str]:
    from normbench.reproduce.claims import claim_ids, load_claim

    lines = []
    for cid in claim_ids():
        c = load_claim(cid)
        extra = f" [cannot run yet: {c.requires}]" if c.requires else ""
        lines.append(f"{cid:<17} {c.claim} ({c.paper}){extra}")
    return lines


def main(argv: list[str]) -> int:
    from normbench.reproduce.claims import SCALES, claim_ids, load_claim
    from normbench.reproduce.runner import reproduce
    from normbench.reproduce.summary import verdict_line

    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    try:
        if argv[0] == "--list":
            print("\n".join(list_claims()))
            return 0
        opts = {"scale": "cpu", "seeds": None, "out": "outputs/reproduce", "min_seeds": "3", "ladder": "false"}
        ids, overrides, dry, launch = [], [], False, True
        for a in argv:
            key, sep, value = a.partition("=")
            if a == "--dry-run":
                dry = True
            elif a == "--no-run":
                launch = False
            elif sep and key in opts:
                opts[key] = value
            elif sep:
                overrides.append(a)
            elif a.startswith("-"):
                raise ConfigError(f"unknown flag {a}; see `python -m normbench reproduce --help`")
            else:
                ids.append(a)
        if opts["scale"] not in SCALES:
            raise ConfigError(f"scale={opts['scale']} is not allowed; choose one of: {', '.join(SCALES)}")
        for key in ("seeds", "min_seeds"):
            if opts[key] is not None and not (
                opts[key].isdigit() and int(opts[key]) >= (2 if key == "min_seeds" else 1)
            ):
                raise ConfigError(f"{key}={opts[key]} must be a whole number (min_seeds >= 2)")
        if opts["ladder"] not in ("true", "false"):
            raise ConfigError(f"ladder={opts['ladder']} is not allowed; choose one of: true, false")
        if not ids:
            raise ConfigError("name a claim (or all); list them with --list")
        if ids == ["all"]:
            ids = claim_ids()
        claims = [load_claim(cid) for cid in ids]
    except ConfigError as exc:
        return error(str(exc))
    code = 0
    seeds = None if opts["seeds"] is None else int(opts["seeds"])
    for c in claims:
        try:
            if opts["ladder"] == "true":
                _ladder(c, opts, seeds, overrides, dry, launch)
                continue
            result = reproduce(c, opts["scale"], seeds, overrides, Path(opts["out"]), int(opts["min_seeds"]), dry,
                               launch=launch)  # fmt: skip
        except ConfigError as exc:
            error(str(exc))
            code = 2
            continue
        if result is not None:
            print(verdict_line(result))
            where = Path(opts["out"]) / c.id
            print(f"normbench: {where / 'verdict.json'}, report {where / 'report.md'}")
    sys.stdout.flush()
    return code


def _ladder(claim, opts: dict, seeds, overrides: list[str], dry: bool, launch: bool) -> None:
    from normbench.reproduce.ladder import run_ladder
    from normbench.reproduce.summary import fmt

    ladder = run_ladder(claim, opts["scale"], seeds, overrides, Path(opts["out"]), int(opts["min_seeds"]), dry,
                        launch=launch)  # fmt: skip
    if ladder is None:
        return
    for r in ladder["rungs"]:
        cis = [t["ci"] or (None, None) for t in r["tests"]]
        parts = [f"{t['name']}: {t['verdict']} {fmt(t['effect'])} [{fmt(lo)}, {fmt(hi)}]"
                 for t, (lo, hi) in zip(r["tests"], cis)]  # fmt: skip
        print(f"{claim.id} d_model {r['d_model']}, {r['n_layer']} blocks: {r['verdict']} ({'; '.join(parts)})")
    where = Path(opts["out"]) / claim.id
    print(f"normbench: {where / 'ladder.json'}, figure {where / 'ladder.png'} ({ladder['run_time_s']:.0f} s of runs)")
