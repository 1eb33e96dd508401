"""What a norm declares about itself, and the registry of ``norm=`` names.

A norm layer subclasses :class:`Norm` and says, as class attributes and classmethods, everything
the rest of normbench asks about it; no other module keeps a list of norm names:

- ``PARAM_KINDS``: its parameters' kinds (model/kinds.py): weight decay and optimizer groups. A torch
  layer inside a norm (an ``nn.Linear``) is the norm's too: its parameters take the kind the norm
  names for ``"<child>.<param>"``, else ``norm``, and the model's init leaves them as the norm built them.
- ``has_gain``: a per-channel gain vector ``weight`` (stored as ``weight + unit_offset``): what
  ``arch.gain_offset`` (1 + w), ``arch=sandwich_depth``'s gain init and the Output-norm gain
  diagnostics act on.
- ``identity``: it builds no layer (``norm=none``): model/combinations.py refuses it where a placement needs
  its norms or ``arch.qk_norm`` needs a norm layer, and notes any other ``norm=`` as ignored by the archs
  that build no norm layer.
- ``statistics_free``: a pointwise map with no statistic (DyT, Derf): it takes a per-site a0
  (``norm.alpha_init_*``), may scale the embedding (``norm.embed_scale``) and gets their init note.
- ``diag_scalars``: its learned scalar parameters; diagnostics record ``norm_<param>_<site>``.
- ``line_style``: the matplotlib line style of its curves in report figures (None: one left free).
- ``keys``: its own ``norm.*`` keys, a dataclass in config/norm_keys.py (a plugin's own:
  :func:`register_norm` adds it to the schema), with their range checks and values for old runs.
- ``leaks(n)``: whether, under the norm config ``n``, its training forward lets a token see later
  positions; validation refuses it without ``norm.allow_leak=true`` and the report flags its runs.
- ``check(cfg)``: refusals (ConfigError, one line) and notes for combinations with other keys.
- ``final_norm(n)``: another ``norm=`` name to build at the final norm instead (SeeDNorm without
  ``norm.seed_final``: RMSNorm there), else None.
- ``from_config(n, dim, alpha)``: the layer for one site (``alpha``: the site's a0).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch.nn as nn

from normbench.config.norm_keys import register_norm_keys

LEAK = (
    "lets each token see later positions through batch statistics over batch x time "
    "(docs/architectures.md §2); set norm.allow_leak=true to train with it anyway"
)


class Norm(nn.Module):
    """The declared interface of a norm layer (module docstring); the defaults declare nothing."""

    PARAM_KINDS: ClassVar[dict[str, str]] = {}
    has_gain: ClassVar[bool] = False
    identity: ClassVar[bool] = False
    statistics_free: ClassVar[bool] = False
    diag_scalars: ClassVar[tuple[str, ...]] = ()
    line_style: ClassVar[Any] = None
    keys: ClassVar[type | None] = None

    @classmethod
    def leaks(cls, n: Any) -> bool:
        return False

    @classmethod
    def leak_refusal(cls, n: Any) -> str:
        """The one-line refusal of a leaking config without ``norm.allow_leak=true``."""
        return f"norm={n.name} {LEAK}"

    @classmethod
    def check(cls, cfg: Any) -> list[str]:
        return []

    @classmethod
    def final_norm(cls, n: Any) -> str | None:
        return None

    @classmethod
    def from_config(cls, n: Any, dim: int, alpha: float) -> nn.Module:
        raise NotImplementedError(f"{cls.__name__}.from_config")


# ``norm=`` names -> builder(cfg, dim, alpha_init), and -> the class that declares what it is
NORMS: dict[str, Callable[..., nn.Module]] = {}
NORM_CLASSES: dict[str, type[Norm]] = {}


def register_norm(name: str, cls: type[Norm] | None = None):
    """Register ``name`` as a ``norm=`` option: decorate its builder (``cls`` declares what it builds)
    or a :class:`Norm` subclass itself (built with its ``from_config``)."""

    def register(target):
        declared = cls
        builder = target
        if isinstance(target, type) and issubclass(target, Norm):
            declared, builder = target, target.from_config
        NORMS[name] = builder
        NORM_CLASSES[name] = declared or Norm
        if getattr(declared, "keys", None) is not None:
            register_norm_keys(declared.keys)
        return target

    return register


def norm_class(name: str) -> type[Norm]:
    """What ``norm=name`` declares (:class:`Norm`'s defaults for a name no class declares)."""
    return NORM_CLASSES.get(name, Norm)


def gain_norms() -> tuple[str, ...]:
    """The ``norm=`` names with a per-channel gain vector, in registration order (for messages)."""
    return tuple(name for name, cls in NORM_CLASSES.items() if cls.has_gain)


def statistics_free_norms() -> tuple[str, ...]:
    return tuple(name for name, cls in NORM_CLASSES.items() if cls.statistics_free)
