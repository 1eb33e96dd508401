"""The duration ladder: one claim at several training lengths, so a verdict comes with its trend in length.

Some verdicts are properties of an architecture, others of how long it trained (Peri-LN's flatter
residual variance forms only late in training). ``normbench reproduce ID duration=ladder`` runs the claim's
sweep (its fixed overrides, seeds and tests) at about 1, 5 and 20 tokens per parameter (or the claim's own
``scales.<scale>.duration`` list) and writes ``<out>/<id>/duration.json`` (each rung's verdict, effect and
interval per test) and ``duration.png`` (the effect against tokens per parameter, log x).

Two ways to get the shorter rungs:

- ``duration=ladder`` (standalone): each rung is an ordinary ``reproduce`` call of that length, with the
  claim's own schedule (cosine, warmup 10% of the run). The top rung is the claim's own verdict sweep,
  reused. Rungs of 1, 5 and 20 tokens per parameter cost 26/20 = 1.3x the verdict's runs, 0.3x on top of a
  verdict already there.
- ``duration=branch``: one warmup-stable-decay trunk at the top length (``sched=wsd``, 20% linear cooldown)
  keeps its checkpoint at each shorter rung's cooldown start (``trainer.save_at``); each shorter rung is a
  branch that resumes there and cools down over its last 20% (Hägele et al. 2024, arXiv:2405.18392: a 20%
  cooldown matches a cosine run of that length; MiniCPM's WSD, arXiv:2404.06395). A branch is an ordinary
  run directory of that rung's settings, seeded with the trunk's checkpoint and metrics up to the fork,
  with ``branch.json`` naming the trunk run and step; it resumes and is reused like any run. Cost: the trunk
  plus 20% of each shorter rung (about 1.06x one top-rung sweep), but the rungs are WSD runs, not the
  verdict's cosine ones, and the warmup is one absolute length for all (10% of the shortest rung). Whether
  that measures the same as standalone runs is checked on this model in docs/claims.md.

Here are only the two rules (:func:`standalone`, :func:`branched`): each rung's overrides, directory and log
line; :mod:`.rungs` runs them as it runs every ladder's. The branches fit that one loop with three per-rung
settings the runner has for them: the trunk is the first rung to run and the last listed (the top rung), each
branch's ``before`` seeds its runs from the trunk's checkpoints just before they run (not on a dry run), and its
``run_time`` is its runs' own seconds, less the trunk's up to the fork that they carry.

Hand-written: a claim-level plan over ``reproduce`` calls; the runs are Hydra multiruns as everywhere.
"""

from __future__ import annotations

import json
import shutil
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from normbench.analysis.loading import find_runs
from normbench.claims.registry import Claim, override_key
from normbench.errors import ConfigError
from normbench.reproduce.ladders.rungs import Ladder, Rung, climb
from normbench.reproduce.length import pin
from normbench.reproduce.plan import Plan, build, layout
from normbench.run.metrics import read_jsonl

if TYPE_CHECKING:
    from normbench.reproduce.request import Request

RATIOS = (1, 5, 20)
MODES = ("ladder", "branch")
NAMES = {"ladder": "duration", "branch": "duration_branch"}  # each mode's files: <out>/<id>/<name>.json, .png
COOLDOWN = 0.2  # the WSD cooldown's share of each rung (Hägele et al. 2024)


def ratios(claim: Claim, scale: str, given=None) -> list[float]:
    """The rungs' tokens per parameter: ``given`` (the command's ``rungs=``), the claim's, or 1, 5, 20."""
    if given:
        return sorted(float(r) for r in given)
    declared = claim.sweep(scale).duration
    return sorted(declared) if declared is not None else [float(r) for r in RATIOS]


def _per_job_ratio(claim: Claim, scale: str, overrides) -> float | None:
    """A ``trainer.tokens_per_param`` in the scale's fixed overrides or the user's (resolved per job)."""
    found = [o for o in claim.settings(scale, overrides) if override_key(o) == "trainer.tokens_per_param"]
    return float(found[-1].split("=", 1)[1]) if found else None


def _rung_override(claim: Claim, scale: str, overrides, ratio: float, jobs=None) -> list[str]:
    """What makes the claim's sweep train ``ratio`` tokens per parameter ([] at the claim's own length).
    ``jobs``: the claim's jobs composed for ``overrides`` already (the ladder's plan)."""
    own = claim.sweep(scale).tokens_per_param
    per_job = _per_job_ratio(claim, scale, overrides)
    if own is None and per_job is None:
        raise ConfigError(
            f"claim {claim.id}: scale={scale} declares no tokens_per_param, so it has no length to ladder; "
            "use scale=cpu"
        )
    if float(own if per_job is None else per_job) == ratio:
        return []
    if per_job is not None:
        return [f"trainer.tokens_per_param={ratio:g}"]
    return [pin(claim, scale, overrides, ratio, jobs=jobs).override]


def run_duration(claim: Claim, req: Request, log=print) -> dict | None:
    """The claim's sweep at each rung's length (``req.rungs``, else the claim's or :data:`RATIOS`), standalone
    (``req.duration`` ladder: :func:`standalone`) or branched off one WSD trunk (branch: :func:`branched`);
    duration.json and its figure (None on a dry run)."""
    if req.duration not in MODES:
        raise ConfigError(f"duration={req.duration} is not allowed; choose one of: {', '.join(MODES)}")
    if req.duration == "branch" and _per_job_ratio(claim, req.scale, list(req.overrides)) is not None:
        raise ConfigError(
            f"claim {claim.id}: duration=branch needs one length for every job, and this claim resolves "
            "tokens_per_param per job; use duration=ladder"
        )
    return climb(claim, req, standalone if req.duration == "ladder" else branched, log)


def _ladder(mode: str, rungs: list[Rung]) -> Ladder:
    """The duration ladder of ``mode``: its entries list no overrides (duration.json never has), its figure is
    the effect against tokens per parameter."""
    title = "effect against training length" + (" (WSD branches)" if mode == "branch" else "")
    plot = {"x": "tokens_per_param", "xlabel": "tokens per parameter", "log_base": 10, "title": title}
    return Ladder(NAMES[mode], rungs, header={"mode": mode}, plot=plot, overrides=False)


def _fields(ratio: float) -> dict:
    """A rung's entry opening: its tokens per parameter and steps, in that place in duration.json. Their values
    are the run's (:func:`.rungs.ladder_rung`'s, after them): its steps and the ratio its baseline reached."""
    return {"tokens_per_param": ratio, "steps": None}


def standalone(claim: Claim, req: Request, base: Plan) -> Ladder:
    """A rung per length, each an ordinary sweep of that length (none added at the claim's own: its sweep)."""
    scale, out, overrides = req.scale, req.out, list(req.overrides)
    rungs = []
    for ratio in ratios(claim, scale, req.rungs):
        extra = _rung_override(claim, scale, overrides, ratio, base.pairs)
        where = out if not extra else out / claim.id / "duration" / f"tpp{ratio:g}"
        rungs.append(Rung(tuple(extra), where, f"duration rung {ratio:g} tokens per parameter", _fields(ratio)))
    return _ladder("ladder", rungs)


def branched(claim: Claim, req: Request, base: Plan) -> Ladder:
    """The WSD trunk at the top length (run first, listed last: the top rung), keeping its checkpoint at each
    shorter rung's cooldown start; then each shorter rung, its runs seeded from those checkpoints just before
    they run (:func:`seed_branches`) and timed by their own seconds, not the trunk's they carry."""
    scale, seeds, out, overrides = req.scale, req.seeds, req.out, list(req.overrides)
    rs = ratios(claim, scale, req.rungs)
    steps = {r: _steps(claim, scale, base, r) for r in rs}
    warmup = _warmup(claim, scale, overrides, steps[rs[0]])
    forks = {r: steps[r] - round(COOLDOWN * steps[r]) for r in rs[:-1]}
    if warmup is not None and any(k < warmup for k in forks.values()):
        raise ConfigError(f"claim {claim.id}: a {rs[0]:g}-token rung cools down inside its {warmup}-step warmup")
    wsd = ["sched=wsd", f"sched.decay_fraction={COOLDOWN}", *([f"sched.warmup_steps={warmup}"] if warmup else [])]
    save_at = f"trainer.save_at=[{','.join(map(str, forks.values()))}]"
    trunk_extra = [*wsd, f"trainer.max_steps={steps[rs[-1]]}", save_at]
    trunk_out = out / claim.id / "duration" / "branch" / f"tpp{rs[-1]:g}"
    label = f"WSD trunk, {rs[-1]:g} tokens per parameter ({steps[rs[-1]]} steps), forks at " + ", ".join(
        f"step {k} ({r:g} tokens per parameter)" for r, k in forks.items()
    )
    rungs = [Rung(tuple(trunk_extra), trunk_out, label, _fields(rs[-1]), last=True)]
    # the trunk's plan, pinned as its reproduce call pins it: where it trains, and its mode (compile=auto's pin),
    # which the branches resume in
    trunk = build(claim, scale, seeds, [*overrides, *trunk_extra], trunk_out, log=lambda *a: None, base=base)
    mode = [trunk.mode.override] if trunk.mode else []
    for r, k in forks.items():
        extra = [*wsd, *mode, f"trainer.max_steps={steps[r]}", "trainer.resume_allow_changed=[trainer.max_steps]"]
        where = out / claim.id / "duration" / "branch" / f"tpp{r:g}"
        root = layout(claim, scale, seeds, [*overrides, *extra], where)[0]
        label = f"duration rung {r:g} tokens per parameter: branches from step {k}"
        seed = partial(seed_branches, trunk.root, root, k)
        rungs.append(Rung(tuple(extra), where, label, _fields(r), before=seed, run_time=partial(_own_seconds, root)))
    return _ladder("branch", rungs)


def _steps(claim, scale, base, ratio) -> int:
    given = [o for o in base.users if override_key(o) == "trainer.max_steps"]
    if given:
        raise ConfigError("duration=branch sets trainer.max_steps per rung; leave it out of the overrides")
    return pin(claim, scale, base.users, ratio, jobs=base.pairs).steps


def _warmup(claim, scale, overrides, shortest: int) -> int | None:
    """The one warmup every rung shares: the claim's own (a fixed or swept ``sched.warmup_steps``), else
    10% of the shortest rung (the warmup that rung's standalone run would get)."""
    keys = {override_key(o) for o in claim.settings(scale, overrides)}
    keys |= {k for grid in claim.grids(scale, overrides) for k in grid}
    return None if "sched.warmup_steps" in keys else int(0.1 * shortest)


def seed_branches(trunk_root: Path, root: Path, step: int, log=print) -> float:
    """Each trunk run's checkpoint at ``step`` as the start of the same job under ``root`` (a branch run dir
    with the trunk's metrics up to the fork and ``branch.json``); skipped where the branch exists. Returns
    the trunk seconds up to the forks of the branches there are (the branches' shared, not own, time)."""

    shared = 0.0
    for run in find_runs(trunk_root) if trunk_root.is_dir() else []:
        src = run.path / "checkpoints" / f"step_{step}.pt"
        dest = root / run.path.relative_to(trunk_root)
        records = read_jsonl(run.path / "metrics.jsonl")
        before = [r for r in records if isinstance(r.get("step"), int) and r["step"] <= step]
        at_fork = before[-1] if before else {}  # the last record the checkpoint covers
        shared += float(at_fork.get("time_s") or 0.0)
        if (dest / "branch.json").exists() or not src.exists():
            continue
        (dest / "checkpoints").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(run.path / "metrics.jsonl", dest / "metrics.jsonl")  # the resume keeps steps <= fork
        shutil.copyfile(src, dest / "checkpoints" / "last.pt")
        info = {"trunk": str(run.path), "step": step, "trunk_time_s": at_fork.get("time_s")}
        (dest / "branch.json").write_text(json.dumps(info, indent=1))
        log(f"normbench: branch {dest} from {run.path} at step {step}")
    return shared


def _own_seconds(root: Path, shared: float) -> float:
    """The wall seconds of the runs under ``root`` less ``shared`` (the trunk's up to the fork, which a branch's
    summary counts as its own)."""
    return sum(float((r.summary or {}).get("wall_s") or 0) for r in (find_runs(root) if root.is_dir() else [])) - shared
