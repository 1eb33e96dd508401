"""Runs shared across claims: one training serves every claim whose plan asks for it.

Several claims train the same baseline (Pre-LN + LayerNorm, tiny, 4 blocks, 3 seeds at 20 tokens per
parameter appears in five claims' sweeps), each under its own settings hash. Each run a plan expects has a
content address, :func:`address`: the hash of its resolved config (seed included) without the keys that
change neither its trajectory nor what its records hold. ``<out>/_runs/<address>`` is a link to the run
directory where that training lives (a claim's own ``runs/<scale>-<hash>/sweep<i>/<job>/``, wherever it
was trained first, runs already on disk included: :func:`register`). Before a claim's sweep is launched,
each of its runs that is not on disk is linked to a finished run of the same address (:func:`serve`),
and only the runs left are trained (:func:`missing_argvs`: one multirun per job, into the claim's own
directories, so that Hydra never writes into a run another claim made). The report loader follows the
links (report/loading.find_runs).

Which keys may differ: :data:`TRAJECTORY_FREE` (the diagnostics, the log, eval and checkpoint cadence,
bookkeeping) leave the trajectory bit for bit (tests/test_shared_runs.py trains it); of them,
:data:`MEASURED` change what the records hold (the metrics read the diagnostic records at their cadence,
the best val loss the evaluations at theirs), so they stay in the address. The diagnostics' switches
(``diag=off|default|full``) are served by a run that recorded at least as much (:data:`DIAG_RANK`: full
records everything default does, on the same steps); a claim that measures time (tokens_per_s,
seconds_to_target) is served only by runs with its own diagnostics, which cost time.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

TRAJECTORY_FREE = (
    "diag",
    "trainer.log_every",
    "trainer.eval_every",
    "trainer.ckpt_every",
    "trainer.ckpt_every_s",
    "trainer.ckpt_async",
    "trainer.activation_checkpointing",
    "trainer.save_at",
    "logger",
    "trainer.resume",
    "trainer.resume_allow_changed",
    "data.cache_dir",
    "trainer.stop_grace_s",
    "trainer.skip_memory_check",
    "peak_flops",
)
MEASURED = (
    "trainer.log_every",
    "trainer.eval_every",
    "diag.every",
    "diag.batch",
    "diag.spike_factor",
    "diag.spike_window",
)
DIAG_RANK = {"off": 0, "default": 1, "full": 2}
TIMED = ("tokens_per_s", "seconds_to_target")
STORE = "_runs"


def _under(key: str, prefixes) -> bool:
    return any(key == p or key.startswith(p + ".") for p in prefixes)


def timed(claim) -> bool:
    return any(t.metric in TIMED for t in claim.tests)


def address(cfg, seed, measured: bool = True) -> str:
    """The content address of one run: the composed ``cfg`` with ``seed``, the trajectory-free keys left out
    (the measured ones kept; ``measured=False``: left out too, the address of the trajectory alone)."""
    from normbench.config.spec import spec_of  # deferred (start-up time): torch, omegaconf
    from normbench.run.resume import flat_config  # deferred (start-up time): hydra, omegaconf

    flat = flat_config(cfg)
    spec = spec_of(cfg)  # precision=auto and compile=auto as resolved: a run of today's default keeps its address
    flat.update(seed=int(seed), precision=spec.precision, compile=spec.compile)
    kept = {k: v for k, v in flat.items() if not _under(k, TRAJECTORY_FREE) or (measured and k in MEASURED)}
    return hashlib.sha1(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _runs(p):
    """(address, the run's dir, the job) for every run the plan expects, seeds included."""
    by_values = {(j.sweep, json.dumps(j.values, sort_keys=True)): j for j in p.jobs}
    for i, expected in enumerate(p.expected):
        for run in expected:
            values = {k: v for k, v in run.items() if k != "seed"}
            job = by_values[(i, json.dumps(values, sort_keys=True))]
            yield address(job.cfg, _seed(job, run)), p.run_dir(run, i), job, run


def _seed(job, run: dict):
    """The seed of one expected run: its own, else its job's."""
    return run.get("seed", job.cfg.get("seed", 0))


def _finished(run_dir: Path):
    """The run at ``run_dir`` (a RunReader: its summary and config, its metrics never read) if it finished
    (completed or diverged), else None."""
    from normbench.claims.measure import FINISHED  # deferred (start-up time): torch, hydra, omegaconf
    from normbench.run.reader import RunReader  # deferred (start-up time): yaml

    if not (run_dir / "summary.json").is_file():
        return None
    run = RunReader(run_dir)
    return run if (run.summary or {}).get("status") in FINISHED else None


def _diag(run) -> str:
    return str(((run.config or {}).get("diag") or {}).get("name") or "default")


def serve(p, log=print) -> int:
    """Link each run of the plan that is not on disk to a finished run of its address, where that one
    recorded at least the diagnostics this one needs (a claim that measures time: the same ones); returns
    how many were linked."""
    store, linked, same = p.out / STORE, 0, timed(p.claim)
    for addr, run_dir, job, _ in _runs(p):
        entry = store / addr
        if run_dir.exists() or run_dir.is_symlink() or not entry.exists():
            continue
        target = entry.resolve()
        have = _finished(target)
        needed = str(job.cfg.diag.name)
        if have is None or DIAG_RANK.get(_diag(have), 0) < DIAG_RANK.get(needed, 0) or (same and _diag(have) != needed):
            continue  # it recorded less than this claim reads, or (a timed claim) its diagnostics took other time
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(target, run_dir.parent), run_dir)
        linked += 1
    if linked:
        log(f"normbench: {p.claim.id}: {linked} runs served by runs trained once already ({store}/)")
    return linked


def register(p) -> None:
    """Each finished run the plan has on disk in its own directories becomes its address's run (the first
    one stays: another claim's run of the same address is not replaced)."""
    store = p.out / STORE
    for addr, run_dir, _, _ in _runs(p):
        entry = store / addr
        if run_dir.is_symlink() or entry.is_symlink() or _finished(run_dir) is None:
            continue
        store.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(run_dir, store), entry)


def shared_dirs(p, i: int) -> bool:
    """Whether sweep ``i`` has runs linked to other claims' (then it is launched job by job)."""
    return any(run_dir.is_symlink() for _, run_dir, job, _ in _runs(p) if job.sweep == i)


def missing_argvs(p, i: int) -> list[list[str]]:
    """Sweep ``i`` as one ``train -m`` per job with runs to train, over just those seeds: the same run
    directories as the grid's (the same sweep dir, subdir and excluded keys), none of the linked ones."""
    from normbench.reproduce.plan import hydra_spelling  # deferred (start-up time): torch, hydra, omegaconf

    todo: dict[str, tuple[dict, list[str]]] = {}
    for _, run_dir, job, run in _runs(p):
        if job.sweep != i or run_dir.is_symlink() or _finished(run_dir) is not None:
            continue
        values = {k: v for k, v in run.items() if k != "seed"}
        entry = todo.setdefault(json.dumps(values, sort_keys=True), (values, []))
        if "seed" in run:
            entry[1].append(str(run["seed"]))
    argv = p.argvs[i]  # ["-m", *settings, *grid, "trainer.resume=true", *hydra's]
    head, tail = argv[: 1 + len(p.fixed)], argv[argv.index("trainer.resume=true") :]
    argvs = []
    for values, seeds in todo.values():
        swept = [f"{k}={hydra_spelling(k, v)}" for k, v in values.items()]
        argvs.append([*head, *swept, *([f"seed={','.join(seeds)}"] if seeds else []), *tail])
    return argvs


def estimates(p) -> list[tuple[str, float, bool, str]]:
    """(address, estimated seconds, finished already, the trajectory's address) for every run the plan
    expects: what ``reproduce all --dry-run`` adds up over the claims (each address once). Two addresses of
    one trajectory are runs that differ only in the cadence of their records: one run at the finer cadence
    could serve both, if the claims' cadences were aligned (``tally_line`` counts them)."""
    from normbench.reproduce.estimate import job_seconds  # deferred (start-up time): torch, hydra, omegaconf
    from normbench.validation import to_config  # deferred (start-up time): torch, hydra, omegaconf

    seconds: dict[int, float] = {}
    out = []
    for addr, run_dir, job, run in _runs(p):
        if id(job) not in seconds:
            seconds[id(job)] = job_seconds(to_config(job.cfg))[0]
        entry = p.out / STORE / addr
        done = _finished(run_dir) is not None or (entry.exists() and _finished(entry.resolve()) is not None)
        trajectory = address(job.cfg, _seed(job, run), measured=False)
        out.append((addr, seconds[id(job)], done, trajectory))
    return out


def tally_line(tally: list[tuple[str, float, bool, str]]) -> str:
    """``282 runs, 243 distinct (39 shared between claims; distinct only by their records' cadence: 0), 243 to
    train: 15.3 CPU-hours (one thread a run), about 7.6 h of this machine's 2 cores at jobs=2 (estimate)``."""
    from normbench.reproduce.estimate import spoken  # deferred (start-up time): torch, hydra, omegaconf

    distinct = {addr: (s, done) for addr, s, done, _ in tally}
    todo = [s for s, done in distinct.values() if not done]
    cadence = len(distinct) - len({t for *_, t in tally})  # distinct runs that differ only in the cadence
    shared = f"{len(tally) - len(distinct)} shared between claims; distinct only by their records' cadence: {cadence}"
    cores = os.cpu_count() or 1
    return (
        f"{len(tally)} runs, {len(distinct)} distinct ({shared}), "
        f"{len(todo)} to train: {sum(todo) / 3600:.1f} CPU-hours (one thread a run), {spoken(sum(todo) / cores)} "
        f"of this machine's {cores} cores at jobs={cores} (estimate)"
    )
