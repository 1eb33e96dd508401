"""The ``norm.*`` keys, one small dataclass per owner, each with its range checks and its values for old runs.

``NormConfig`` (config/schema.py) is these dataclasses together: the keys every norm reads
(:class:`NormKeys`), then each family's own. A norm class names its keys (``keys = PowerNormKeys``,
norm/norm_api.py); a norm outside the package registers its own dataclass with
:func:`register_norm_keys` (norm/norm_api.register_norm does it), which adds its fields to the
schema the next time it is registered (``schema.register_configs``), so ``norm.<key>=...`` overrides
and conf/norm/<name>.yaml can set them.

A keys class declares:

- ``check(n)``: the limits of its values whatever norm is chosen (ConfigError, one line naming the key
  and what is allowed); the checks that depend on the chosen norm live on the norm class (``check``);
- ``OLD_RUNS``: for keys added after runs were made, the value that computes what those runs computed
  (a callable gets the new run's flat config); run/resume.py resumes an old checkpoint under it.
  Keys of a registered plugin get their defaults (runs made before it never had that norm).
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from typing import Any, ClassVar

from normbench.errors import ConfigError


def positive(key: str, value: Any, zero_ok: bool = False) -> None:
    """``key`` must be > 0 (>= 0 with ``zero_ok``); None passes (unset)."""
    if value is None:
        return
    if value != value or value < 0 or (value == 0 and not zero_ok):  # value != value: NaN
        raise ConfigError(f"{key}={value} must be {'>= 0' if zero_ok else '> 0'}")


def unit_interval(key: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"{key}={value} must be in [0, 1]")


@dataclass
class NormKeys:
    """The keys every norm reads."""

    name: str = "rmsnorm"  # conf/config.yaml's default norm (config/schema.py: one value per default)
    eps: float = 1e-6
    affine: bool = True  # false: no gain vector (the "no scale" ablation)
    bias: bool = False  # layernorm / dyt / derf additive bias
    OLD_RUNS: ClassVar[dict] = {}

    @classmethod
    def check(cls, n) -> None:
        positive("norm.eps", n.eps)


@dataclass
class PointwiseKeys:
    """DyT and Derf (norm/norms.py): per-site a0, Derf's shift, the embedding scalar."""

    alpha_init_attn: float | None = None  # dyt/derf: initial scalar alpha per site; None: width rule
    alpha_init_ffn: float | None = None  # (norm/norms.py alpha_rule)
    alpha_init_final: float | None = None
    shift_init: float = 0.0  # derf: initial scalar shift
    embed_scale: bool = False  # dyt/derf: learnable embedding scalar, init sqrt(d)
    OLD_RUNS: ClassVar[dict] = {}

    @classmethod
    def check(cls, n) -> None:
        for site in ("attn", "ffn", "final"):
            positive(f"norm.alpha_init_{site}", getattr(n, f"alpha_init_{site}"))


@dataclass
class SeeDNormKeys:
    """SeeDNorm (norm/scale_and_batch_norms.py, docs/architectures.md §2)."""

    seed_heads: int = 1  # seednorm: slices with their own seed <x_i, beta_i> (the paper's multi-head form)
    seed_alpha_init: float = 1.0  # seednorm: alpha init (gamma = 1, beta = 0)
    seed_final: bool = False  # seednorm: also the final norm (false: RMSNorm there; docs/architectures.md §2)
    OLD_RUNS: ClassVar[dict] = {
        "seed_alpha_init": 1.0,
        "seed_heads": 1,
        # SeeDNorm runs made before the key had SeeDNorm at the final norm too; for other norms it is inert
        "seed_final": lambda new: new.get("norm.name") == "seednorm" or new.get("norm.seed_final"),
    }

    @classmethod
    def check(cls, n) -> None:
        positive("norm.seed_heads", n.seed_heads)


@dataclass
class BatchNormKeys:
    bn_momentum: float = 0.05  # batchnorm: running-stat momentum (the PowerNorm repo's BN baseline)
    OLD_RUNS: ClassVar[dict] = {"bn_momentum": 0.05}

    @classmethod
    def check(cls, n) -> None:
        unit_interval("norm.bn_momentum", n.bn_momentum)


@dataclass
class PowerNormKeys:
    pn_alpha_fwd: float = 0.9  # powernorm: EMA of the running quadratic mean phi
    pn_alpha_bkw: float = 0.9  # powernorm: EMA factor of the approximate backward
    pn_groups: int = 1  # powernorm: groups of the per-token group scaling (reference NormSelect: n_head)
    pn_warmup: int = 0  # powernorm: steps on batch statistics first (leaks the future; needs allow_leak)
    OLD_RUNS: ClassVar[dict] = {"pn_alpha_fwd": 0.9, "pn_alpha_bkw": 0.9, "pn_groups": 1, "pn_warmup": 0}

    @classmethod
    def check(cls, n) -> None:
        positive("norm.pn_groups", n.pn_groups)
        positive("norm.pn_warmup", n.pn_warmup, zero_ok=True)
        unit_interval("norm.pn_alpha_fwd", n.pn_alpha_fwd)
        unit_interval("norm.pn_alpha_bkw", n.pn_alpha_bkw)


@dataclass
class LeakKeys:
    """Any norm that declares it leaks (norm/norm_api.Norm.leaks) trains only with this set."""

    allow_leak: bool = False  # batchnorm / powernorm warmup: train with statistics over future positions
    OLD_RUNS: ClassVar[dict] = {"allow_leak": False}

    @classmethod
    def check(cls, n) -> None:
        pass


# the order of the fields in NormConfig (and so in a saved config): NormKeys first, LeakKeys last
BUILTIN_KEYS = (NormKeys, PointwiseKeys, SeeDNormKeys, BatchNormKeys, PowerNormKeys, LeakKeys)
PLUGIN_KEYS: list[type] = []  # register_norm_keys: the keys of norms registered outside the package


def register_norm_keys(keys: type) -> None:
    """Add a norm's own keys dataclass to the schema (at the next ``schema.register_configs``)."""
    if keys in BUILTIN_KEYS or keys in PLUGIN_KEYS:
        return
    taken = {f.name for k in (*BUILTIN_KEYS, *PLUGIN_KEYS) for f in fields(k)}
    clash = sorted(taken & {f.name for f in fields(keys)})
    if clash:
        raise ConfigError(f"{keys.__name__}: norm.{clash[0]} is already a norm key; give it a name of its own")
    PLUGIN_KEYS.append(keys)


def all_keys() -> tuple[type, ...]:
    return (*BUILTIN_KEYS, *PLUGIN_KEYS)


def check_norm_keys(n) -> None:
    """Every keys class's own limits (ConfigError, one line)."""
    for keys in all_keys():
        check = getattr(keys, "check", None)
        if check is not None:
            check(n)


def old_run_values() -> dict[str, object]:
    """``norm.<key>`` -> the value runs made before the key existed computed with (see module doc)."""
    out: dict[str, object] = {}
    for keys in BUILTIN_KEYS:
        out.update({f"norm.{k}": v for k, v in keys.OLD_RUNS.items()})
    for keys in PLUGIN_KEYS:
        old = getattr(keys, "OLD_RUNS", None)
        if old is None:
            old = {f.name: f.default for f in fields(keys) if f.default is not MISSING}
        out.update({f"norm.{k}": v for k, v in old.items()})
    return out
