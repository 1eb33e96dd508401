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
"""

from __future__ import annotations

from dataclasses import dataclass

from normbench.reproduce.claims import LENGTH_KEYS, Claim, override_key


@dataclass(frozen=True)
class Pinned:
    ratio: float
    steps: int
    tokens: int
    params: int  # the reference model's weight-matrix parameters (train/length.py)
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


def pin(claim: Claim, scale: str, overrides=(), ratio: float | None = None) -> Pinned | None:
    """The scale's ``tokens_per_param`` (or ``ratio``: a duration rung's) as steps for every job, or None (no
    ratio, or the user set a length)."""
    from normbench.reproduce.shared import compose_jobs, test_sides
    from normbench.run.resume import flat_config
    from normbench.train import length

    ratio = ratio if ratio is not None else claim.sweep(scale).get("tokens_per_param")
    if ratio is None or {override_key(o) for o in overrides} & set(LENGTH_KEYS):
        return None
    jobs = compose_jobs(claim, scale, overrides)
    flat = [(values, flat_config(cfg), cfg) for values, cfg in jobs]
    test = next(t for t in claim.tests if not t.informative)
    _, base = test_sides(test, [(v, f) for v, f, _ in flat])
    values = base[0][0] if base else flat[0][0]
    cfg = next(c for v, _, c in flat if v == values)
    n = length.length_params(cfg)
    steps = max(1, round(float(ratio) * n / length.tokens_per_step(cfg)))
    return Pinned(float(ratio), steps, steps * length.tokens_per_step(cfg), n, dict(values))
