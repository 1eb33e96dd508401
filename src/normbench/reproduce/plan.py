"""A claim's plan: every job of its sweeps composed once, the pins set in it, its sides and run directories.

``reproduce`` reads a claim in one pass: claim -> plan -> pins -> check -> run -> measure -> verdict.
:func:`build` composes each job (one grid point, seeds aside) as ``normbench train`` would compose it,
once; the pins (:data:`PINS`: the length and the execution mode of :mod:`.length`) are steps that rewrite
the plan, each setting its key in every composed config (:meth:`Plan.set`) and adding its override to the
sweeps' commands; the shared-keys check (:mod:`.shared`) reads the composed configs, the runner
(:mod:`.runner`) launches :attr:`Plan.argvs`, the dry run (:mod:`.dryrun`) prints them with an estimate
from the same configs. A new pin (an LR, an init) is one more function in :data:`PINS`. The ladders
(:mod:`.ladders.rungs`) compose the claim's jobs once (:func:`start`) and build each rung's plan
from copies of them (:meth:`Plan.derived`).

Layout (:func:`layout`): ``<out>/<id>/runs/<scale>-<hash>/sweep<i>/<overrides>/`` holds the runs; the hash
is of the fixed and user overrides (the pins' included), so changed settings never reuse or resume a run
of other settings; ``<overrides>`` is Hydra's ``override_dirname`` of the swept keys (:meth:`Plan.run_dir`).
"""

from __future__ import annotations

import copy
import hashlib
import itertools
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from normbench.claims.registry import Claim, override_key
from normbench.config.files import GROUPS

_ABSENT = object()  # Plan._settable: no value to set (compose instead)


@dataclass
class Job:
    """One grid point of a claim's sweeps: its grid, its swept values (seeds aside) and its composed config."""

    sweep: int
    values: dict[str, str]
    cfg: object


@dataclass
class Plan:
    claim: Claim
    scale: str
    seeds: int | None  # the command's seeds= (None: the claim's own)
    overrides: list[str]  # the user's (hydra.* included), then each pin's
    out: Path
    jobs: list[Job] = field(default_factory=list)
    pinned: object = None  # length.Pinned, where the length was pinned
    mode: object = None  # length.Mode, where compile=auto was pinned

    @property
    def users(self) -> list[str]:
        """The overrides the runs train with (no hydra.*)."""
        return [o for o in self.overrides if not o.startswith("hydra")]

    @property
    def pairs(self) -> list[tuple[dict, object]]:
        """The jobs as (swept values, composed config), the form the pins and the shared check read."""
        return [(j.values, j.cfg) for j in self.jobs]

    @property
    def fixed(self) -> list[str]:
        return self.claim.settings(self.scale, self.users)

    @property
    def root(self) -> Path:
        return layout(self.claim, self.scale, self.seeds, self.overrides, self.out)[0]

    @property
    def argvs(self) -> list[list[str]]:
        """One ``train -m`` argv per sweep."""
        return layout(self.claim, self.scale, self.seeds, self.overrides, self.out)[1]

    @property
    def expected(self) -> list[list[dict]]:
        """Each sweep's runs as {swept key: value}, seeds included."""
        return layout(self.claim, self.scale, self.seeds, self.overrides, self.out)[2]

    def sweep_jobs(self, i: int) -> list[Job]:
        return [j for j in self.jobs if j.sweep == i]

    def sides(self, test) -> tuple[list[Job], list[Job]]:
        """The jobs of a test's group and of its baseline (none for a baseline that is a number)."""
        from normbench.reproduce.shared import test_sides  # deferred (start-up time): hydra, numpy
        from normbench.run.resume import flat_config  # deferred (start-up time): hydra

        group, base = test_sides(test, [(j, flat_config(j.cfg)) for j in self.jobs])
        return [j for j, _ in group], [j for j, _ in base]

    def run_dir(self, run: dict, sweep: int) -> Path:
        """Where Hydra puts the run ``run`` ({swept key: value}, seed included) of sweep ``sweep``: its
        ``override_dirname``, the swept keys spelled as Hydra's sweeper spells them, sorted."""
        exclude = _excluded(self.claim, self.scale, self.overrides)
        lines = sorted(f"{k}={hydra_spelling(k, v)}" for k, v in run.items() if override_key(k) not in exclude)
        return self.root / f"sweep{sweep}" / ",".join(lines)

    def set(self, override: str, value) -> None:
        """Rewrite the plan as composing it with ``override`` (``key=...``, whose parsed value is ``value``)
        appended would give it: the key set in each composed config, since a plain value appended last is
        what Hydra's override does; composed again where that is not so (:meth:`_settable`). The override
        joins the sweeps' commands."""

        if self._settable(override) is _ABSENT:
            self.jobs = compose(self.claim, self.scale, [*self.users, override])
        elif not override.startswith("hydra"):
            for job in self.jobs:
                OmegaConf.update(job.cfg, override_key(override), value, merge=False)
        self.overrides = [*self.overrides, override]

    def _settable(self, override: str):
        """The value Hydra parses from ``override`` where setting it in the composed configs is what composing
        with it appended gives: a plain ``key=value`` of a key every job has and no grid sweeps; else
        _ABSENT (a config group, ``+key``, ``~key``, ``key=a,b``, a swept or unknown key, a parse error)."""
        from hydra.core.override_parser.overrides_parser import OverridesParser  # deferred (start-up time): hydra

        key = override_key(override)
        if override.startswith("hydra"):
            return None
        if override.startswith(("+", "~")) or key in GROUPS or "/" in key:
            return _ABSENT
        if any(key in grid for grid in self.claim.grids(self.scale, self.users)):
            return _ABSENT  # the override changes the grid itself
        if any(OmegaConf.select(j.cfg, key, default=_ABSENT) is _ABSENT for j in self.jobs):
            return _ABSENT
        try:
            (parsed,) = OverridesParser.create().parse_overrides([override])
        except Exception:  # Hydra's parse error: composing with it names it in one line
            return _ABSENT
        return _ABSENT if parsed.is_sweep_override() else parsed.value()

    def add(self, override: str) -> None:
        """:meth:`set` with the value Hydra parses from the override."""
        self.set(override, self._settable(override))

    def derived(self, overrides) -> Plan:
        """A copy of this plan (unpinned) with ``overrides`` added (:meth:`add`): a ladder's rung from the
        claim's own jobs, composed once for the whole ladder (again, once, where an override needs it)."""

        plan = Plan(self.claim, self.scale, self.seeds, list(self.overrides), self.out, copy.deepcopy(self.jobs))
        if any(plan._settable(o) is _ABSENT for o in overrides):
            plan.overrides = [*plan.overrides, *overrides]
            plan.jobs = compose(self.claim, self.scale, plan.users)
            return plan
        for o in overrides:
            plan.add(o)
        return plan


def compose(claim: Claim, scale: str, overrides=()) -> list[Job]:
    """Every job of the claim's sweeps at ``scale`` composed once, in grid order."""
    from normbench.reproduce.shared import compose_jobs  # deferred (start-up time): hydra, numpy

    sweeps = [
        i
        for i, grid in enumerate(claim.grids(scale, overrides))
        for _ in itertools.product(*(v for k, v in grid.items() if k != "seed"))
    ]
    return [Job(i, values, cfg) for i, (values, cfg) in zip(sweeps, compose_jobs(claim, scale, overrides))]


def _pin_length(plan: Plan, log) -> None:
    from normbench.reproduce.length import pin  # deferred (start-up time): hydra, numpy

    pinned = pin(plan.claim, plan.scale, plan.users, jobs=plan.pairs)
    if pinned is not None:
        log(f"normbench: {plan.claim.id}: {pinned.describe()}")
        plan.set(pinned.override, pinned.steps)
        plan.pinned = pinned


def _pin_mode(plan: Plan, log) -> None:
    from normbench.reproduce.length import pin_compile  # deferred (start-up time): hydra, numpy

    env = threads_env(plan.overrides)  # the jobs' torch threads as the runner sets them (None: this process's)
    threads = int(env["OMP_NUM_THREADS"]) if env else None
    mode = pin_compile(plan.claim, plan.scale, plan.users, jobs=plan.pairs, threads=threads)
    if mode is not None:
        log(f"normbench: {plan.claim.id}: {mode.reason}; {mode.override} for every job")
        plan.set(mode.override, mode.compile)
        plan.mode = mode


def _check_corpus(plan: Plan, log) -> None:
    """scale=gpu refuses a corpus it would repeat more than 4 times (reproduce/length.py)."""
    from normbench.reproduce.length import check_corpus  # deferred (start-up time): hydra, numpy

    check_corpus(plan.claim, plan.scale, plan.users, jobs=plan.pairs)


# The pins, in order: each reads the plan and rewrites it (the mode is decided on the pinned length).
PINS = (_check_corpus, _pin_length, _pin_mode)


def start(claim: Claim, scale: str, seeds: int | None, overrides, out: Path) -> Plan:
    """The claim's plan before the pins: its jobs composed once for ``overrides``."""
    users = [o for o in overrides if not o.startswith("hydra")]
    return Plan(claim, scale, seeds, list(overrides), Path(out), compose(claim, scale, users))


def build(claim: Claim, scale: str, seeds: int | None, overrides, out: Path, log=print, base: Plan | None = None):
    """The claim's plan: its jobs composed once, then every pin of :data:`PINS` applied. ``base``: a plan of
    the claim (from :func:`start`) whose overrides begin ``overrides``: its jobs with the rest added
    (:meth:`Plan.derived`), so the rungs of a ladder compose no job again."""
    overrides = list(overrides)
    if base is not None and overrides[: len(base.overrides)] == base.overrides:
        plan = base.derived(overrides[len(base.overrides) :])
        plan.seeds, plan.out = seeds, Path(out)
    else:
        plan = start(claim, scale, seeds, overrides, out)
    for step in PINS:
        step(plan, log)
    return plan


def _excluded(claim: Claim, scale: str, overrides) -> set[str]:
    from normbench.run.resume import BOOKKEEPING_KEYS  # deferred (start-up time): hydra

    return set(BOOKKEEPING_KEYS) | {override_key(o) for o in claim.settings(scale, overrides)}


def layout(claim: Claim, scale: str, seeds: int | None, overrides: list[str], out: Path):
    """(settings dir, one `train -m` argv per sweep, the expected runs {key: value} of each sweep)."""
    s = claim.sweep(scale)
    n_seeds = seeds if seeds is not None else s.seeds
    settings = claim.settings(scale, overrides)
    launch = [o for o in overrides if o.startswith("hydra")]
    digest = hashlib.sha1("\n".join(settings).encode()).hexdigest()[:8]
    root = Path(out) / claim.id / "runs" / f"{scale}-{digest}"
    argvs, jobs = [], []
    from normbench.run.resume import BOOKKEEPING_KEYS  # deferred (start-up time): hydra

    exclude = list(BOOKKEEPING_KEYS) + sorted({override_key(o) for o in settings})
    for i, grid in enumerate(claim.grids(scale, overrides)):  # a user override wins over a swept key
        if "seed" not in {override_key(o) for o in overrides}:  # seed=K: one seed, the user's
            grid["seed"] = [str(x) for x in range(n_seeds)]
        argvs.append(
            [
                "-m",
                *settings,
                *[f"{k}={','.join(v)}" for k, v in grid.items()],
                "trainer.resume=true",
                f"hydra.sweep.dir={root / f'sweep{i}'}",
                "hydra.sweep.subdir=${hydra.job.override_dirname}",
                f"hydra.job.config.override_dirname.exclude_keys=[{','.join(exclude)}]",
                *launch,
            ]
        )
        jobs.append([dict(zip(grid, combo)) for combo in itertools.product(*grid.values())])
    return root, argvs, jobs


def hydra_spelling(key: str, value) -> str:
    """A value as Hydra's sweeper writes it into a job's override (``1e-3`` -> ``0.001``, ``true`` -> ``True``)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser  # deferred (start-up time): hydra

    (parsed,) = OverridesParser.create().parse_overrides([f"{key}={value}"])
    return parsed.get_value_element_as_str()


def threads_env(argv: list[str]) -> dict[str, str]:
    """``OMP_NUM_THREADS=1`` (torch's intra-op threads, read at its import in each joblib worker) where a
    sweep runs more than one job at a time (``hydra.launcher.n_jobs=N``: reproduce's jobs=N); else nothing."""
    given = [a.split("=", 1)[1] for a in argv if a.startswith("hydra.launcher.n_jobs=")]
    if not given or given[-1] in ("1", "null"):
        return {}
    return {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
