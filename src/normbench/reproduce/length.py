"""A claim's length in tokens per parameter, pinned to one number of steps for every job.

A claim scale says how long its runs train as ``tokens_per_param`` (conf/claims/*.yaml; 20 at
``scale=cpu``, Chinchilla's ratio, Hoffmann et al. 2022). Resolved per job, the ratio would give each
side its own length wherever the sides' weight matrices differ (SimpleNorm's and nGPT's untied heads), and
the shared check (:mod:`.shared`) would refuse the comparison. So the ratio is resolved once, against the
model of the claim's *baseline* side (the first test that gives the verdict), into ``trainer.max_steps``
for every job: both sides train the same tokens, and each run's summary records the tokens per parameter
it reached (``tokens_per_param``: 20 for the baseline, a little less for a side with more matrices).

A length the user gives (``trainer.max_steps=...``, ``max_tokens``, ``tokens_per_param``) wins and
nothing is pinned; ``trainer.tokens_per_param=R`` as an override resolves per job, and is refused where
the sides' lengths would differ.

The execution mode is pinned the same way (:func:`pin_compile`): ``compile=auto`` decides from each
model's FLOPs and the run's length (runtime/compiling.py), so two sides could land in different modes
(nGPT's step is costlier than Pre-LN's). Where a job would get ``compile=auto``, it is decided once,
against the baseline job, and every job gets that ``compile=true|false``: a comparison never sets
compiled losses against eager ones. A claim's (or the user's) ``compile=auto`` is decided by the estimate on
either device; the config's default ``auto``, where nothing gives ``compile``, only on a GPU (on CPU every
job resolves it alike, to eager: config/spec.py, and nothing is pinned).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from normbench.claims.registry import LENGTH_KEYS, Claim, override_key
from normbench.errors import ConfigError
from normbench.runtime import length


@dataclass(frozen=True)
class Pinned:
    ratio: float
    steps: int
    tokens: int
    params: int  # the reference model's weight-matrix parameters (runtime/length.py)
    reference: dict  # the baseline job's swept values

    @property
    def override(self) -> str:
        return f"trainer.max_steps={self.steps}"

    def describe(self) -> str:
        ref = ", ".join(f"{k}={v}" for k, v in self.reference.items()) or "the claim's model"
        return (
            f"length {self.ratio:g} tokens per parameter of the baseline ({ref}: {self.params:,} weight-matrix "
            f"params) = {self.tokens:,} tokens = {self.steps:,} steps, every job"
        )


def pin(claim: Claim, scale: str, overrides=(), ratio: float | None = None, jobs=None) -> Pinned | None:
    """The scale's ``tokens_per_param`` (or ``ratio``: a duration rung's) as steps for every job, or None (no
    ratio, or the user set a length). ``jobs``: the claim's jobs composed for ``overrides`` already."""

    ratio = ratio if ratio is not None else claim.sweep(scale).tokens_per_param
    if ratio is None or {override_key(o) for o in overrides} & set(LENGTH_KEYS):
        return None
    values, cfg = baseline_job(claim, scale, overrides, jobs)
    n = length.length_params(cfg)
    steps = max(1, round(float(ratio) * n / length.tokens_per_step(cfg)))
    return Pinned(float(ratio), steps, steps * length.tokens_per_step(cfg), n, dict(values))


def baseline_job(claim: Claim, scale: str, overrides, jobs=None) -> tuple[dict, object]:
    """(swept values, composed config) of the baseline side of the first test that gives the verdict."""
    from normbench.reproduce.shared import compose_jobs, test_sides  # deferred (start-up time): hydra, numpy
    from normbench.run.resume import flat_config  # deferred (start-up time): hydra

    jobs = jobs if jobs is not None else compose_jobs(claim, scale, overrides)
    test = next(t for t in claim.tests if not t.informative)
    _, base = test_sides(test, [(values, flat_config(cfg)) for values, cfg in jobs])
    values = base[0][0] if base else jobs[0][0]
    return values, next(c for v, c in jobs if v == values)


def asks_auto(claim: Claim, scale: str, overrides) -> str | None:
    """``given`` where some job gets ``compile=auto`` from the claim's fixed overrides or the user's (the last
    ``compile=`` of them, or a swept value), ``default`` where none gives ``compile`` (conf/config.yaml's
    default, auto), None where it is given as true/false. Read from the overrides: composing every job to find
    out would cost seconds on the LR-grid claims, on every ``reproduce``."""
    given = [o.split("=", 1)[1] for o in claim.settings(scale, overrides) if override_key(o) == "compile"]
    swept = [v for grid in claim.grids(scale, overrides) for v in grid.get("compile", [])]
    if "auto" in [*given[-1:], *swept]:
        return "given"
    return None if given or swept else "default"


@dataclass(frozen=True)
class Mode:
    compile: bool
    reason: str  # compiling.decide's line, for the baseline job

    @property
    def override(self) -> str:
        return f"compile={str(self.compile).lower()}"


def pin_compile(claim: Claim, scale: str, overrides=(), jobs=None, threads: int | None = None) -> Mode | None:
    """``compile=auto`` decided once against the baseline job (its model built on the meta device), as one
    ``compile=true|false`` for every job; None where no job would get ``compile=auto``. ``jobs``: the
    claim's jobs composed for ``overrides`` already; ``threads``: the torch threads each job gets (1 under
    ``jobs=N``; None: this process's). On a CPU the step is timed at the dry run's calibrated rate
    (estimate.cpu_rate), so the decision and the estimate read one measurement of this machine."""

    from normbench.model import build_model  # deferred (start-up time): hydra
    from normbench.reproduce.estimate import cpu_rate  # deferred (start-up time): hydra
    from normbench.reproduce.shared import compose_jobs  # deferred (start-up time): hydra, numpy
    from normbench.runtime.compiling import decide  # deferred (start-up time): hydra
    from normbench.train.build import resolve_device  # deferred (start-up time): hydra, numpy

    asked = asks_auto(claim, scale, overrides)
    if asked is None or (asked == "default" and not torch.cuda.is_available()):
        return None  # the default on CPU: every job resolves it alike, eager (config/spec.resolve_compile)
    jobs = jobs if jobs is not None else compose_jobs(claim, scale, overrides)
    _, cfg = baseline_job(claim, scale, overrides, jobs)
    if asked == "default" and resolve_device(cfg).type != "cuda":
        return None
    with torch.device("meta"):
        model = build_model(cfg, length.config_vocab(cfg))
    seeds = max(1, claim.sweep(scale).seeds)  # a model's seeds share its compiled graph
    device = resolve_device(cfg)
    rate = cpu_rate() if device.type == "cpu" else None
    decision = decide(cfg, model, device, runs_per_graph=seeds, threads=threads, thread_flops=rate)
    return Mode(decision.compile, decision.reason)


CHINCHILLA = 20  # tokens per parameter the repetition check measures a scale=gpu corpus against
FINEWEB_HINT = (
    "python -m normbench prepare data=hf data.hf_path=HuggingFaceFW/fineweb-edu data.hf_config=sample-10BT "
    "data.tokenizer=gpt2, then reproduce with the same data overrides"
)


def check_corpus(claim: Claim, scale: str, overrides=(), jobs=None) -> None:
    """At ``scale=gpu``: refuse (one line) a corpus that 20 tokens per parameter of the baseline model would
    pass over more than ``MAX_PASSES`` times (Muennighoff et al. 2023), naming how to prepare one. A length the
    user gives (a smoke run's ``trainer.max_steps=100``) is theirs: the run's start-up line warns instead."""
    from normbench.data.pipeline.prepared import train_tokens  # deferred (start-up time): hydra, numpy

    if scale != "gpu" or {override_key(o) for o in overrides} & set(LENGTH_KEYS):
        return
    _, cfg = baseline_job(claim, scale, overrides, jobs)
    need = CHINCHILLA * length.length_params(cfg)
    have, exact = train_tokens(cfg.data)
    data = f"data={cfg.data.name}"
    if have is None:
        raise ConfigError(
            f"reproduce {claim.id} scale=gpu: {data} is not prepared yet; prepare it first: {FINEWEB_HINT}"
        )
    if need / have > length.MAX_PASSES:
        size = f"{have:,}" if exact else f"about {have:,}"
        raise ConfigError(
            f"reproduce {claim.id} scale=gpu: {data} holds {size} training tokens; {CHINCHILLA} tokens per parameter "
            f"({need:,}) would pass over it {need / have:,.0f} times (> {length.MAX_PASSES}, Muennighoff et al. "
            f"2023); prepare a larger corpus, e.g. FineWeb-edu's sample-10BT: {FINEWEB_HINT}"
        )
