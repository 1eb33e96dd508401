"""Run (or reuse) a claim's sweep, judge it, write verdict.json, the report and the claim's figure.

Layout: ``<out>/<id>/runs/<scale>-<hash>/sweep<i>/<overrides>/`` holds the runs (the hash is of
the fixed overrides, so changed settings never reuse or resume a run of other settings);
``<out>/<id>/verdict.json``, ``report.md``/``report.html`` (opening with the verdict) and
``claim.png`` describe the latest call. Each sweep is one ``normbench train -m`` (any Hydra
launcher) with ``trainer.resume=true``: it is skipped when all its runs finished (completed or
diverged); otherwise finished jobs finish at once and the others resume from their checkpoint.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from normbench.errors import ConfigError
from normbench.report.loading import find_runs, norm_value, setting
from normbench.reproduce import benchmark, dryrun
from normbench.reproduce.claims import Claim, override_key
from normbench.reproduce.length import pin, pin_compile
from normbench.reproduce.measure import FINISHED, judge_claim
from normbench.reproduce.shared import check_claim, compose_jobs, with_pin
from normbench.reproduce.skip_eval import read_skip, skip_losses
from normbench.run.resume import BOOKKEEPING_KEYS


def plan(
    claim: Claim, scale: str, seeds: int | None, overrides: list[str], out: Path
) -> tuple[Path, list[list[str]], list[dict]]:  # noqa: E501
    """(settings dir, one `train -m` argv per sweep, the expected jobs {key: value} of each sweep)."""
    s = claim.sweep(scale)
    n_seeds = int(seeds if seeds is not None else s.get("seeds", 3))
    settings = claim.settings(scale, overrides)
    launch = [o for o in overrides if o.startswith("hydra")]
    digest = hashlib.sha1("\n".join(settings).encode()).hexdigest()[:8]
    root = out / claim.id / "runs" / f"{scale}-{digest}"
    argvs, jobs = [], []
    exclude = list(BOOKKEEPING_KEYS) + sorted({override_key(o) for o in settings})
    for i, grid in enumerate(claim.grids(scale, overrides)):  # a user override wins over a swept key
        if "seed" not in {override_key(o) for o in overrides}:  # seed=K: one seed, the user's
            grid["seed"] = [str(x) for x in range(n_seeds)]
        argvs.append(["-m", *settings, *[f"{k}={','.join(v)}" for k, v in grid.items()], "trainer.resume=true",
                      f"hydra.sweep.dir={root / f'sweep{i}'}", "hydra.sweep.subdir=${hydra.job.override_dirname}",
                      f"hydra.job.config.override_dirname.exclude_keys=[{','.join(exclude)}]", *launch])  # fmt: skip
        jobs.append([dict(zip(grid, combo)) for combo in itertools.product(*grid.values())])
    return root, argvs, jobs


def finished(sweep_dir: Path, expected: list[dict]) -> bool:
    runs = find_runs(sweep_dir) if sweep_dir.is_dir() else []
    done = {tuple(setting(r, k) for k in expected[0]) for r in runs if r.status in FINISHED} if expected else set()
    return all(tuple(norm_value(v) for v in job.values()) in done for job in expected)


def train(argv: list[str]) -> int:
    """One ``normbench train`` in a child process (Hydra's global state and the launcher stay there)."""
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return subprocess.call([sys.executable, "-m", "normbench", "train", *argv], env=env)


def needs_skip_eval(claim: Claim) -> bool:
    return any(t.metric == "skip_cost_deep" for t in claim.tests)


def reproduce(claim: Claim, scale: str = "cpu", seeds: int | None = None, overrides=(), out=Path("outputs/reproduce"),
              min_seeds: int = 3, dry_run: bool = False, log=print, launch: bool = True,
              bench: str | None = None) -> dict | None:  # fmt: skip
    """The claim's verdict (None on a dry run); ``bench``: the timing tests' paired benchmark, ``RxS`` or
    ``off`` (:mod:`.benchmark`; --no-run runs none)."""
    bench_plan = benchmark.parse_plan(bench)
    if claim.requires:
        raise ConfigError(f"claim {claim.id} cannot run yet: {claim.requires}")
    out = Path(out)
    pinned, mode, overrides, composed = _pinned(claim, scale, list(overrides), log)
    root, argvs, jobs = plan(claim, scale, seeds, list(overrides), out)
    users = [o for o in overrides if not o.startswith("hydra")]
    inits = check_claim(claim, scale, users, composed)
    fixed = claim.settings(scale, users)
    for test in claim.tests:  # the two sides of each test, named, with their run counts
        log(f"normbench: {claim.id}: {dryrun.sides_line(claim, test, inits[test.name], jobs, fixed)}")
    start, planned = time.perf_counter(), []
    for i, (argv, expected) in enumerate(zip(argvs, jobs)):
        if finished(root / f"sweep{i}", expected):
            log(f"normbench: {claim.id}: sweep {i} ({len(expected)} runs) finished already; reused")
            continue
        if not launch:  # --no-run: judge the runs there are
            log(f"normbench: {claim.id}: sweep {i} has unfinished runs; not launched (--no-run)")
            continue
        if dry_run:
            text, seconds = dryrun.sweep_estimate(claim, scale, users, claim.grids(scale, users)[i], len(expected))
            planned.append((len(expected), seconds))
            log(f"normbench: {claim.id}: sweep {i}: {len(expected)} runs, {text}; to run it yourself:")
            log(f"  {dryrun.command(argv)}")
            continue
        log(f"normbench: {claim.id}: sweep {i}: {dryrun.command(argv)}")
        code = train(argv)
        if code == 2 and not (root / f"sweep{i}").is_dir():
            raise ConfigError(f"{claim.id}: sweep {i} was refused (its error is the line above)")
        if code != 0:
            log(f"normbench: {claim.id}: sweep {i} exited with {code}; judging the runs there are")
    if dry_run:
        if len(planned) > 1:
            from normbench.reproduce.estimate import spoken

            total = sum(n for n, _ in planned)
            log(f"normbench: {claim.id}: {total} runs in {len(planned)} sweeps, {spoken(sum(s for _, s in planned))}")
        return None
    runs = find_runs(root) if root.is_dir() else []
    if needs_skip_eval(claim):
        for r in runs:
            if r.status == "completed" and read_skip(r.path) is None:
                skip_losses(r.path)
        runs = find_runs(root)
    timing = benchmark.timing(bench_plan, None if launch else "no paired benchmark ran (--no-run)", log)
    result = judge_claim(claim, runs, scale, min_seeds, claim.sweep(scale).get("at") or {}, timing=timing)
    run_time = sum(float((r.summary or {}).get("wall_s") or 0) for r in runs)
    result.update(length=_length(pinned, runs), runs_dir=str(root), n_runs=len(runs), compile=_compiled(mode, runs),
                  seconds=round(time.perf_counter() - start, 1),
                  run_time_s=round(run_time, 1),
                  commit=_commit(), settings=claim.sweep(scale).get("fixed", []) + list(overrides))  # fmt: skip
    claim_dir = out / claim.id
    claim_dir.mkdir(parents=True, exist_ok=True)
    (claim_dir / "verdict.json").write_text(json.dumps(result, indent=1, default=str))
    from normbench.reproduce.figure import plot_claim
    from normbench.reproduce.summary import write_report

    plot_claim(result, runs, claim, claim_dir / "claim.png")
    write_report(result, root, claim_dir)
    return result


def _pinned(claim: Claim, scale: str, overrides: list[str], log):
    """The scale's tokens_per_param as one number of steps for every job (.length), and compile=auto as one
    mode for every job (reproduce/length.py), added to the overrides; and every job composed with them
    (composed once: the pins set their key in the composed configs, shared.with_pin)."""
    users = [o for o in overrides if not o.startswith("hydra")]
    jobs = compose_jobs(claim, scale, users)
    pinned = pin(claim, scale, users, jobs=jobs)
    if pinned is not None:
        log(f"normbench: {claim.id}: {pinned.describe()}")
        jobs = with_pin(claim, scale, users, jobs, pinned.override, pinned.steps)
        overrides, users = [*overrides, pinned.override], [*users, pinned.override]
    mode = pin_compile(claim, scale, users, jobs=jobs)
    if mode is not None:
        log(f"normbench: {claim.id}: {mode.reason}; {mode.override} for every job")
        jobs = with_pin(claim, scale, users, jobs, mode.override, mode.compile)
        overrides = [*overrides, mode.override]
    return pinned, mode, overrides, jobs


def _compiled(mode, runs) -> dict:
    """verdict.json's ``compile``: the pinned decision (if compile=auto was asked) and the runs' modes."""
    seen = sorted({bool(r.summary["compiled"]) for r in runs if (r.summary or {}).get("compiled") is not None})
    return {"pinned": mode.compile if mode else None, "reason": mode.reason if mode else None, "runs": seen}


def _length(pinned, runs) -> dict:
    """verdict.json's ``length``: the declared tokens per parameter (if any), the steps, and the tokens per
    parameter the runs reached (min and max over runs; a side with more weight matrices reaches less)."""
    reached = [float(r.summary["tokens_per_param"]) for r in runs if (r.summary or {}).get("tokens_per_param")]
    steps = sorted({int(r.summary["max_steps"]) for r in runs if (r.summary or {}).get("max_steps")})
    return {
        "tokens_per_param": pinned.ratio if pinned else None,
        "steps": pinned.steps if pinned else (steps[0] if len(steps) == 1 else steps),
        "reference_params": pinned.params if pinned else None,
        "reached": [min(reached), max(reached)] if reached else None,
    }


def _commit() -> str | None:
    try:
        here = Path(__file__).resolve().parent
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True,
                              timeout=10).stdout.strip() or None  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
