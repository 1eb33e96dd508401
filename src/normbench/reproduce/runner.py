"""Run (or reuse) a claim's sweep, judge it, write verdict.json, the report and the claim's figure.

One pass: the claim's plan (:mod:`.plan`: its jobs composed once, the length and mode pins set in them),
the shared-keys check on it (:mod:`.shared`), the sweeps run (:func:`execute`), the runs measured and
judged (:mod:`.measure`). Layout: ``<out>/<id>/runs/<scale>-<hash>/sweep<i>/<overrides>/`` holds the runs
(the hash is of the fixed overrides, so changed settings never reuse or resume a run of other settings);
``<out>/<id>/verdict.json``, ``report.md``/``report.html`` (opening with the verdict) and
``claim.png`` describe the latest call. Each sweep is one ``normbench train -m`` (any Hydra
launcher) with ``trainer.resume=true``: it is skipped when all its runs finished (completed or
diverged); otherwise finished jobs finish at once and the others resume from their checkpoint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from normbench.analysis.loading import find_runs, norm_value, setting
from normbench.claims import benchmark
from normbench.claims.figure import plot_claim
from normbench.claims.measure import FINISHED, judge_claim
from normbench.claims.registry import Claim, cpu_mode_name
from normbench.claims.skip_eval import read_skip, skip_losses
from normbench.claims.summary import write_report
from normbench.config.spec import spec_of
from normbench.errors import ConfigError
from normbench.reproduce import dryrun, store
from normbench.reproduce.estimate import spoken
from normbench.reproduce.plan import Plan, build, layout, threads_env
from normbench.reproduce.request import Request
from normbench.reproduce.shared import check_claim
from normbench.runtime.precision import cpu_native_bf16


def plan(
    claim: Claim, scale: str, seeds: int | None, overrides: list[str], out: Path
) -> tuple[Path, list[list[str]], list[dict]]:
    """(settings dir, one `train -m` argv per sweep, the expected jobs {key: value} of each sweep)."""
    return layout(claim, scale, seeds, list(overrides), Path(out))


def _job_key(run, expected: list[dict]) -> tuple:
    """A run's values of the keys its sweep's jobs differ in (the jobs' own: ``norm_value`` of each)."""
    return tuple(setting(run, k) for k in expected[0])


def finished(sweep_dir: Path, expected: list[dict]) -> bool:
    runs = find_runs(sweep_dir) if sweep_dir.is_dir() else []
    done = {_job_key(r, expected) for r in runs if r.status in FINISHED} if expected else set()
    return all(tuple(norm_value(v) for v in job.values()) in done for job in expected)


def planned_runs(root: Path, expected: list[list[dict]]) -> list:
    """The runs below a claim's directory that its plan asks for, each sweep's matched by its jobs' settings as
    :func:`finished` matches them. Runs another call left there are neither judged nor reported: the sweep
    directory is named by the settings, not the seeds, so ``seeds=8`` leaves seeds 3-7 where the claim's own
    3-seed call looks next, and a verdict over all of them would claim 8 seeds for a 3-seed request."""
    runs = find_runs(root) if root.is_dir() else []
    wanted = {
        f"sweep{i}": (jobs, {tuple(norm_value(v) for v in job.values()) for job in jobs})
        for i, jobs in enumerate(expected)
        if jobs
    }

    def planned(run) -> bool:
        jobs, keys = wanted.get(Path(run.path).relative_to(root).parts[0], (None, ()))
        return jobs is not None and _job_key(run, jobs) in keys

    return [r for r in runs if planned(r)]


def train(argv: list[str]) -> int:
    """One ``normbench train`` in a child process (Hydra's global state and the launcher stay there). Jobs
    run several at a time (``hydra.launcher.n_jobs=N``, reproduce's jobs=N) get one torch thread each: two
    one-thread runs use two cores far better than one run on two threads (docs/performance.md)."""
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(threads_env(argv))
    return subprocess.call([sys.executable, "-m", "normbench", "train", *argv], env=env)


def needs_skip_eval(claim: Claim) -> bool:
    return any(t.metric == "skip_cost_deep" for t in claim.tests)


def reproduce(
    claim: Claim, req: Request, log=print, base: Plan | None = None, tally: list | None = None
) -> dict | None:
    """claim -> plan -> pins -> check -> run -> measure -> verdict (None on a dry run), for the request's scale,
    seeds, overrides and directory (a ladder's rung: :meth:`.request.Request.rung`). ``base``: the claim's jobs
    composed already (a ladder's, :func:`.plan.start`), for overrides that begin ``req.overrides``; ``tally``: a
    list each planned run is added to (:func:`.store.estimates`: ``reproduce all --dry-run``'s total). The timing
    tests' paired benchmark is ``req.bench`` (:mod:`normbench.claims.benchmark`; --no-run runs none)."""
    if claim.requires:
        raise ConfigError(f"claim {claim.id} cannot run yet: {claim.requires}")
    scale, out = req.scale, req.out
    p = build(claim, scale, req.seeds, list(req.overrides), out, log, base)  # every job composed once, pins set
    inits = check_claim(claim, scale, p.users, p.pairs)
    log(f"normbench: {claim.id}: {dryrun.lr_line(claim, p.pairs)}")  # the LR every job trains at, beside the length
    for test in claim.tests:  # the two sides of each test, named, with their run counts
        log(f"normbench: {claim.id}: {dryrun.sides_line(claim, test, inits[test.name], p.expected, p.fixed)}")
    start = time.perf_counter()
    if not execute(p, req.dry_run, req.launch, log, tally):
        return None
    root = p.root
    runs = planned_runs(root, p.expected)
    if needs_skip_eval(claim):
        for r in runs:
            if r.status == "completed" and read_skip(r.path) is None:
                skip_losses(r.path)
        runs = planned_runs(root, p.expected)
    timing = benchmark.timing(req.bench, None if req.launch else "no paired benchmark ran (--no-run)", log)
    result = judge_claim(claim, runs, scale, req.min_seeds, claim.sweep(scale).at, timing=timing)
    run_time = sum(float((r.summary or {}).get("wall_s") or 0) for r in runs)
    result.update(
        length=_length(p.pinned, runs),
        runs_dir=str(root),
        n_runs=len(runs),
        compile=_compiled(p.mode, runs),
        mode=_mode(p),
        seconds=round(time.perf_counter() - start, 1),
        run_time_s=round(run_time, 1),
        commit=_commit(),
        settings=[*claim.sweep(scale).fixed, *p.overrides],
        protocol=protocol(claim, req),
    )
    claim_dir = out / claim.id
    claim_dir.mkdir(parents=True, exist_ok=True)
    (claim_dir / "verdict.json").write_text(json.dumps(result, indent=1, default=str))

    plot_claim(result, runs, claim, claim_dir / "claim.png")
    write_report(result, root, claim_dir, runs)
    return result


def execute(p: Plan, dry_run: bool = False, launch: bool = True, log=print, tally: list | None = None) -> bool:
    """Run (or reuse) each sweep of the plan, its runs trained once across claims (:mod:`.store`: a run of
    another claim with the same training serves it); a dry run prints each sweep with its estimate instead,
    and adds each of its runs to ``tally`` (:func:`.store.estimates`). False on a dry run."""
    cid, root, planned = p.claim.id, p.root, []
    if not dry_run:
        store.serve(p, log)
    for i, (argv, expected) in enumerate(zip(p.argvs, p.expected)):
        if finished(root / f"sweep{i}", expected):
            log(f"normbench: {cid}: sweep {i} ({len(expected)} runs) finished already; reused")
            continue
        if not launch:  # --no-run: judge the runs there are
            log(f"normbench: {cid}: sweep {i} has unfinished runs; not launched (--no-run)")
            continue
        if dry_run:
            text, seconds = dryrun.sweep_estimate([j.cfg for j in p.sweep_jobs(i)], len(expected))
            planned.append((len(expected), seconds))
            log(f"normbench: {cid}: sweep {i}: {len(expected)} runs, {text}; to run it yourself:")
            log(f"  {dryrun.command(argv)}")
            continue
        for one in store.missing_argvs(p, i) if store.shared_dirs(p, i) else [argv]:  # served runs never relaunched
            _train_sweep(p, i, one, log)
    if not dry_run:
        store.register(p)
    if tally is not None:
        tally.extend(store.estimates(p))
    if dry_run and len(planned) > 1:
        total = sum(n for n, _ in planned)
        log(f"normbench: {cid}: {total} runs in {len(planned)} sweeps, {spoken(sum(s for _, s in planned))}")
    return not dry_run


def _train_sweep(p: Plan, i: int, argv: list[str], log) -> None:
    log(f"normbench: {p.claim.id}: sweep {i}: {dryrun.command(argv)}")
    code = train(argv)
    if code == 2 and not (p.root / f"sweep{i}").is_dir():
        raise ConfigError(f"{p.claim.id}: sweep {i} was refused (its error is the line above)")
    if code != 0:
        log(f"normbench: {p.claim.id}: sweep {i} exited with {code}; judging the runs there are")


def _compiled(mode, runs) -> dict:
    """verdict.json's ``compile``: the pinned decision (if compile=auto was asked) and the runs' modes."""
    seen = sorted({bool(r.summary["compiled"]) for r in runs if (r.summary or {}).get("compiled") is not None})
    return {"pinned": mode.compile if mode else None, "reason": mode.reason if mode else None, "runs": seen}


def _mode(p: Plan) -> dict:
    """verdict.json's ``mode``: the execution mode the claim's jobs train in (precision, attention kernel, the
    pinned compile) and the CPU it was chosen for: ``cpu_mode`` is what scale cpu picks on a CPU with or without
    native bf16 (claims/registry.cpu_mode), ``native_bf16`` what this machine has."""
    cfg = p.jobs[0].cfg
    spec = spec_of(cfg)  # precision=auto and an unpinned compile=auto as a run resolves them (config/spec.py)
    return {
        "precision": spec.precision,
        "attn_fp32": bool(cfg.attn_fp32),
        "compile": spec.compile,
        "cpu_mode": cpu_mode_name() if p.scale == "cpu" else None,
        "native_bf16": cpu_native_bf16(),
    }


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


def protocol(claim: Claim, req: Request) -> dict:
    """What the command changed of the claim's declared protocol at its scale (the claim page says so): its
    overrides (hydra.* aside; a ladder's rung's among them) and the seeds it asked for, beside the claim's."""
    return {
        "overrides": [o for o in req.overrides if not o.startswith("hydra")],
        "seeds": req.seeds,
        "declared_seeds": claim.sweep(req.scale).seeds,
    }


def _commit() -> str | None:
    try:
        here = Path(__file__).resolve().parent
        return (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        return None
