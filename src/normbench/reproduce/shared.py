"""One init per comparison: the compared groups of a claim differ only in what the claim is about.

Before a claim's sweep runs, every job of it (one per grid point, seeds aside) is composed as
``normbench train`` would compose it, and each test's group is set against its baseline, key by key
of the resolved config. A key may differ only when the claim sweeps it (a swept config group, e.g.
``arch``, frees its whole section ``arch.*``), when it is bookkeeping (``run/resume.FREE_KEYS``), or when
the claim file names it under ``part_of_claim`` with the reason. The tokens each side trains are
checked beside the keys as ``tokens`` (``trainer.tokens_per_param`` resolves against each model's own
weight matrices, so equal keys can still mean unequal lengths). The weight init is checked beside
the keys as ``init_std``: the std the plain matrices and the embedding start from, as the model
builds them (``model.weight_init_std``). A swept ``norm`` frees ``norm.*`` but never the init, so a
norm comparison always starts from one init; an arch whose paper brings its own init (nGPT, Fixup,
SimpleNorm, ...) is compared only where the claim file says that init is part of the claim.

Hand-written: no library knows which keys a claim is about; the composition is Hydra's.
"""

from __future__ import annotations

import itertools

from normbench.claims.registry import Claim, Test, as_str
from normbench.config.files import GROUPS, compose_config
from normbench.errors import ConfigError
from normbench.runtime import length

INIT = "init_std"
TOKENS = "tokens"  # the tokens a job trains (runtime/length.py): one length per comparison


def _spell(value) -> str:
    from normbench.analysis.loading import norm_value  # deferred (start-up time): hydra, numpy

    return norm_value(as_str(value))


def compose(claim: Claim, overrides: list[str], what) -> object:
    """The config ``train`` would compose for ``overrides``; Hydra's error as one line naming ``what``."""

    try:
        return compose_config(overrides)
    except Exception as exc:  # Hydra's own errors: one line with the job
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"claim {claim.id}: job {what} does not compose: {first}") from None


def compose_jobs(claim: Claim, scale: str, overrides=()) -> list[tuple[dict, object]]:
    """Every job of the claim's sweeps at ``scale`` (no seeds): ({swept key: value}, composed config)."""
    fixed = claim.settings(scale, overrides)
    jobs = []
    for grid in claim.grids(scale, overrides):
        grid = {k: v for k, v in grid.items() if k != "seed"}
        for combo in itertools.product(*grid.values()):
            values = dict(zip(grid, combo))
            jobs.append((values, compose(claim, [*fixed, *(f"{k}={v}" for k, v in values.items())], values)))
    return jobs


def _value(flat: dict, key: str):
    """A job's value for a test's selector key (``arch`` means ``arch.name``)."""
    return flat.get(f"{key}.name") if key in GROUPS else flat.get(key)


def _selects(flat: dict, where: dict) -> bool:
    return all(_value(flat, k) is not None and _spell(_value(flat, k)) == _spell(v) for k, v in where.items())


def _free(key: str, about: set[str], declared: set[str]) -> bool:
    from normbench.run.resume import FREE_KEYS  # deferred (start-up time): hydra

    def under(k: str, prefixes) -> bool:
        return any(k == p or k.startswith(p + ".") for p in prefixes)

    return under(key, FREE_KEYS) or under(key, declared) or under(key, about | {f"{g}." for g in about & set(GROUPS)})


def test_sides(test: Test, jobs: list) -> tuple[list, list]:
    at = dict(test.at)
    group = [j for j in jobs if _selects(j[1], {**at, **test.group})]
    base = [j for j in jobs if isinstance(test.baseline, dict) and _selects(j[1], {**at, **test.baseline})]
    return group, base


def _pairs(group: list, base: list, about: set[str]) -> list:
    """(group job, baseline job) pairs to set side by side: those equal in every grid key both sweep
    that the test is not about (an LR grid: each LR against the same LR); all pairs if none are."""

    def same(g, b) -> bool:
        return all(_spell(g[0][k]) == _spell(b[0][k]) for k in (g[0].keys() & b[0].keys()) - about)

    matched = [(g, b) for g, b in itertools.product(group, base) if same(g, b)]
    return matched or list(itertools.product(group, base))


def _check_pair(claim: Claim, test: Test, g, b, about: set[str], declared: set[str]) -> None:
    if g[3] != b[3] and TOKENS not in declared:
        raise ConfigError(
            f"claim {claim.id}, test {test.name!r}: the compared groups would train different numbers of tokens "
            f"({g[3]:,} for {g[0]} vs {b[3]:,} for {b[0]}: trainer.tokens_per_param counts each model's own "
            "weight matrices); give both one length (trainer.max_steps), or name tokens under part_of_claim "
            "with the reason"
        )
    if g[2] != b[2] and INIT not in declared:
        raise ConfigError(
            f"claim {claim.id}, test {test.name!r}: the compared groups start from different inits "
            f"(init_std {g[2]:.4g} for {g[0]} vs {b[2]:.4g} for {b[0]}); share one init, or name "
            "init_std under part_of_claim with the reason"
        )
    keys = sorted(set(g[1]) | set(b[1]))
    diff = [k for k in keys if g[1].get(k) != b[1].get(k) and not _free(k, about, declared)]
    if diff:
        k = diff[0]
        raise ConfigError(
            f"claim {claim.id}, test {test.name!r}: the compared groups differ in {k} ({g[1].get(k)} for "
            f"{g[0]} vs {b[1].get(k)} for {b[0]}), which the test is not about; share it, or name it under "
            "part_of_claim with the reason"
        )


def run_tokens(cfg) -> int:
    """The tokens a composed job trains: its steps (trainer.tokens_per_param resolved) x tokens per step."""

    return length.run_steps(cfg) * length.tokens_per_step(cfg)


def check_claim(claim: Claim, scale: str, overrides=(), jobs=None) -> dict[str, dict[str, list[float]]]:
    """ConfigError (one line, naming the key) if a test's two sides differ in a key the test is not
    about (its group, baseline, ``at`` and ``tune`` keys) and the claim does not declare; else
    {test name: {side: the init_std values}} for the start-up printout. ``jobs``: the claim's jobs
    composed for ``overrides`` already (else composed here)."""
    from normbench.model import weight_init_std  # deferred (start-up time): hydra
    from normbench.run.resume import flat_config  # deferred (start-up time): hydra

    declared = set((claim.part_of_claim or {}).keys())
    jobs = [
        (values, flat_config(cfg), weight_init_std(cfg), run_tokens(cfg))
        for values, cfg in (jobs if jobs is not None else compose_jobs(claim, scale, overrides))
    ]
    inits: dict[str, dict[str, list[float]]] = {}
    for test in claim.tests:
        about = {*test.group, *(test.baseline if isinstance(test.baseline, dict) else {}), *test.at}
        about |= {test.tune} if test.tune else set()
        group, base = test_sides(test, jobs)
        inits[test.name] = {
            side: sorted({j[2] for j in js}) for side, js in (("group", group), ("baseline", base)) if js
        }
        for g, b in _pairs(group, base, about):
            _check_pair(claim, test, g, b, about, declared)
    return inits
