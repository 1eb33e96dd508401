"""The claims registry: one YAML file per claim in ``conf/claims/<id>.yaml`` (the id is the file name).

A claim file holds ``claim`` (in words), ``paper``, ``scales`` (``cpu``, ``quick`` and ``gpu``: ``seeds``,
``fixed`` overrides, ``sweeps``: a list of {key: [values]} grids, each one Hydra multirun, ``tokens_per_param``:
the length, resolved once for every job, :mod:`.length`; a scale written ``{like: cpu, ...}`` is that
scale with a few keys changed, :func:`_derived`) and
``tests``: each with ``name``, ``kind`` (difference | on_par | outcome | largest_lr), ``metric`` (one of
:data:`METRICS`, or a downstream score ``TASK/METRIC``, e.g. ``arc_easy/acc_norm``, read from each run's
``eval.json``: ``python -m normbench eval`` writes it),
``group`` and ``baseline`` ({key: value} selecting runs; a difference baseline may be a number),
``at`` (settings both sides share), ``direction`` (higher | lower), ``threshold`` or ``band``,
``transform`` (log), ``target`` (a val loss, for *_to_target metrics) and ``tune`` (a key, e.g.
``optim.lr``: each side is judged at its own best value of it, see :func:`.measure.tuned`). ``requires`` names what
the code still lacks: such a claim refuses to run and says so. ``part_of_claim`` maps a key the compared groups
may differ in without sweeping it (``init_std``: an arch's own init) to the reason (:mod:`.shared`). ``lr``
says in words the LR the claim is judged at and why (the recipe's carried LR, ``optim.lr=auto``, by default).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from normbench.config.files import config_dir
from normbench.errors import ConfigError
from normbench.run.eval_file import split_metric
from normbench.runtime.precision import cpu_native_bf16

KINDS = ("difference", "on_par", "outcome", "largest_lr")
SCALES = ("cpu", "quick", "gpu")
LENGTH_KEYS = ("trainer.max_steps", "trainer.max_tokens", "trainer.tokens_per_param")
# The claims' execution mode at scale cpu (the verdict's), chosen by what this CPU does fast (:func:`cpu_mode`):
# with native bf16 (avx512_bf16, AMX, Arm's bf16), bf16 autocast with the attention kernel in fp32; without it,
# fp32, where an emulated bf16 product runs at a few per cent of the fp32 rate. Both compile where compiling pays
# (compile=auto, pinned once per claim: reproduce/length.py). Each is the fastest form of the miniature on its kind
# of CPU (docs/performance.md §7), and the two give the same verdicts (docs/claims.md, "bf16 against fp32"); the
# papers train in bf16 mixed precision. Put ahead of a claim's own ``fixed``, so a claim file or a user override
# (``precision=fp32 attn_fp32=false compile=false``) sets another. quick and gpu keep their own.
CPU_MODES = {
    "bf16": ("precision=bf16", "attn_fp32=true", "compile=auto"),
    "fp32": ("precision=fp32", "attn_fp32=false", "compile=auto"),
}


def cpu_mode_name() -> str:
    """``bf16`` on a CPU with native bf16 products, else ``fp32`` (runtime/precision.cpu_native_bf16)."""
    return "bf16" if cpu_native_bf16() else "fp32"


def cpu_mode() -> tuple[str, ...]:
    """The claims' execution mode on this machine, as the overrides ``scale=cpu`` starts with."""
    return CPU_MODES[cpu_mode_name()]


METRICS = (
    "best_val_loss",
    "final_val_loss",
    "tokens_per_s",
    "var_growth",
    "grad_spread",
    "grad_cv",
    "massive_ratio_peak",
    "massive_onset_frac",
    "steps_to_target",
    "tokens_to_target",
    "seconds_to_target",
    "skip_cost_deep",
    "learned",
    "attn_logit_peak",
    "attn_logit_peak_tau",
)


@dataclass
class Test:
    name: str
    kind: str
    metric: str
    group: dict
    baseline: dict | float
    at: dict = field(default_factory=dict)
    direction: str = "lower"
    threshold: float = 0.0
    band: list[float] | None = None
    transform: str | None = None
    target: float | None = None
    informative: bool = False  # reported beside, left out of the claim's verdict
    tune: str | None = None  # a key each side is judged at its own best value of (e.g. optim.lr)


@dataclass(frozen=True)
class Scale:
    """One scale of a claim (``cpu``, ``quick`` or ``gpu``), parsed once from its file (:func:`_scale`)."""

    name: str
    sweeps: tuple[dict, ...]  # each {key: [values]}: one Hydra multirun
    fixed: tuple[str, ...] = ()  # the overrides every job trains with (the claims' mode first at scale cpu)
    seeds: int = 3
    tokens_per_param: float | None = None  # the length, resolved once for every job (reproduce/length.py)
    at: dict = field(default_factory=dict)  # settings every test is judged at (verdict.judge_claim)
    ladder: tuple[tuple[str, ...], ...] | None = None  # the width ladder's rungs, as override lists
    duration: tuple[float, ...] | None = None  # the duration ladder's rungs, in tokens per parameter


@dataclass
class Claim:
    id: str
    claim: str
    paper: str
    scales: dict[str, Scale]
    tests: list[Test]
    requires: str | None = None
    notes: str = ""
    part_of_claim: dict = field(default_factory=dict)  # {key: why}: keys the compared groups may differ in
    lr: str = ""  # the LR the claim is judged at and why (docs/init.md, "The learning rate")

    def sweep(self, scale: str) -> Scale:
        if scale not in self.scales:
            raise ConfigError(
                f"scale={scale} is not declared for claim {self.id}; choose one of: {', '.join(self.scales)}"
            )
        return self.scales[scale]

    def settings(self, scale: str, overrides=()) -> list[str]:
        """The overrides every job of the claim trains with: its ``fixed`` ones, then the user's (no hydra.*)."""
        return [o for o in [*self.sweep(scale).fixed, *overrides] if not o.startswith("hydra")]

    def grids(self, scale: str, overrides=()) -> list[dict[str, list[str]]]:
        """Each grid of the claim's sweeps, values spelled as overrides; a key the user sets is not swept."""
        given = {override_key(o) for o in overrides}
        return [
            {k: [as_str(v) for v in (vs if isinstance(vs, list) else [vs])] for k, vs in grid.items() if k not in given}
            for grid in self.sweep(scale).sweeps
        ]


def override_key(override: str) -> str:
    """The key of a Hydra override (``+key=v``, ``~key``, ``key=v`` -> ``key``)."""
    return override.split("=", 1)[0].lstrip("+~")


def claims_dir() -> Path:

    return config_dir() / "claims"


def claim_ids(directory: Path | None = None) -> list[str]:
    return sorted(p.stem for p in (directory or claims_dir()).glob("*.yaml"))


def _test(cid: str, raw: dict) -> Test:
    where = f"claim {cid}, test {raw.get('name', '?')!r}"
    if raw.get("kind") not in KINDS:
        raise ConfigError(f"{where}: kind={raw.get('kind')} is not one of: {', '.join(KINDS)}")
    if raw.get("metric") not in METRICS and not split_metric(str(raw.get("metric"))):
        choices = f"{', '.join(METRICS)}, or TASK/METRIC (a downstream score in eval.json, e.g. arc_easy/acc)"
        raise ConfigError(f"{where}: metric={raw.get('metric')} is not one of: {choices}")
    if raw.get("direction", "lower") not in ("lower", "higher"):
        raise ConfigError(f"{where}: direction must be lower or higher")
    if raw["kind"] == "on_par" and not (isinstance(raw.get("band"), list) and len(raw["band"]) == 2):
        raise ConfigError(f"{where}: an on_par test needs band: [low, high]")
    if raw["kind"] in ("difference", "outcome") and not float(raw.get("threshold") or 0) > 0:
        raise ConfigError(f"{where}: a {raw['kind']} test needs threshold > 0 (the band of no meaningful effect)")
    known = set(Test.__dataclass_fields__)
    if extra := set(raw) - known:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(extra))}; allowed: {', '.join(sorted(known))}")
    test = Test(**raw)
    test.group = {k: as_str(v) for k, v in test.group.items()}
    test.at = {k: as_str(v) for k, v in test.at.items()}
    if isinstance(test.baseline, dict):
        test.baseline = {k: as_str(v) for k, v in test.baseline.items()}
    return test


def _derived(cid: str, scales: dict, scale: str) -> dict:
    """A scale written ``{like: other, ...}``: the other scale's sweep with these keys over it; its ``fixed``
    overrides replace the other's of the same key, and a ``tokens_per_param`` (or a length in ``fixed``)
    replaces the other's length (``trainer.max_steps``, ``max_tokens``, ``tokens_per_param``)."""
    s = scales[scale]
    if not isinstance(s, dict) or "like" not in s:
        return s
    base = scales.get(s["like"])
    if not isinstance(base, dict) or "like" in base:
        raise ConfigError(f"claim {cid}: scales.{scale}.like={s['like']} must name a scale written out in full")
    own = [str(o) for o in s.get("fixed", [])]
    replaced = {override_key(o) for o in own}
    if "tokens_per_param" in s or replaced & set(LENGTH_KEYS):
        replaced |= set(LENGTH_KEYS)
    merged = {**base, **{k: v for k, v in s.items() if k not in ("like", "fixed")}}
    if "tokens_per_param" not in s and replaced & set(LENGTH_KEYS):
        merged.pop("tokens_per_param", None)
    merged["fixed"] = [o for o in base.get("fixed", []) if override_key(str(o)) not in replaced] + own
    return merged


def _scale(cid: str, name: str, raw) -> Scale:
    """A scale's keys checked and typed; at scale cpu the claims' mode goes ahead of the claim's ``fixed``."""
    where = f"claim {cid}: scales.{name}"
    if name not in SCALES or not isinstance(raw, dict) or "sweeps" not in raw:
        raise ConfigError(f"{where} must be one of {', '.join(SCALES)} with sweeps")
    known = set(Scale.__dataclass_fields__) - {"name"}
    if extra := set(raw) - known:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(extra))}; allowed: {', '.join(sorted(known))}")
    ratio = raw.get("tokens_per_param")
    if ratio is not None and not (isinstance(ratio, int | float) and ratio > 0):
        raise ConfigError(f"{where}.tokens_per_param={ratio} must be a positive number")
    ladder, duration = raw.get("ladder"), raw.get("duration")
    if ladder is not None and not (isinstance(ladder, list) and all(isinstance(r, list) for r in ladder)):
        raise ConfigError(f"{where}.ladder must be a list of override lists")
    if duration is not None and not (
        isinstance(duration, list) and all(isinstance(r, int | float) and r > 0 for r in duration)
    ):
        raise ConfigError(f"{where}.duration must be a list of tokens per parameter")
    fixed = [str(o) for o in raw.get("fixed", [])]
    return Scale(
        name=name,
        sweeps=tuple(raw["sweeps"]),
        fixed=tuple([*cpu_mode(), *fixed] if name == "cpu" else fixed),
        seeds=int(raw.get("seeds", Scale.seeds)),
        tokens_per_param=ratio,
        at=dict(raw.get("at") or {}),
        ladder=None if ladder is None else tuple(tuple(str(o) for o in r) for r in ladder),
        duration=None if duration is None else tuple(float(r) for r in duration),
    )


def as_str(value) -> str:
    """A YAML value as an override writes it (``true``, not ``True``)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def load_claim(cid: str, directory: Path | None = None) -> Claim:
    path = (directory or claims_dir()) / f"{cid}.yaml"
    if not path.is_file():
        raise ConfigError(f"unknown claim {cid!r}; choose one of: {', '.join(claim_ids(directory))}, all")
    raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    for key in ("claim", "paper", "scales", "tests"):
        if key not in raw:
            raise ConfigError(f"claim {cid} ({path}): missing key {key!r}")
    scales = {name: _scale(cid, name, _derived(cid, raw["scales"], name)) for name in raw["scales"]}
    tests = [_test(cid, t) for t in raw["tests"] or []]
    part = raw.get("part_of_claim") or {}
    if not isinstance(part, dict) or not all(isinstance(v, str) and v.strip() for v in part.values()):
        raise ConfigError(f"claim {cid}: part_of_claim must map each key to the reason it is part of the claim")
    if not any(not t.informative for t in tests):
        raise ConfigError(f"claim {cid}: needs at least one test that is not informative (it gives the verdict)")
    return Claim(
        id=cid,
        claim=str(raw["claim"]).strip(),
        paper=str(raw["paper"]).strip(),
        scales=scales,
        tests=tests,
        requires=raw.get("requires"),
        notes=str(raw.get("notes") or "").strip(),
        part_of_claim={str(k): str(v).strip() for k, v in part.items()},
        lr=str(raw.get("lr") or "").strip(),
    )
