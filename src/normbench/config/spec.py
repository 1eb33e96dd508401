"""A run's resolved spec: the numbers its config leaves to a rule, resolved once.

``optim.lr: auto`` is a request ("the recipe's LR carried to this width", config/lr_rule.py), not a number.
:func:`run_spec` turns it into one, here and nowhere else; :func:`normbench.validation.prepare` sets the result
on the typed config it returns (``cfg.spec``, frozen), and every reader (the optimizer builder, the start-up
line, summary.json, the claims' dry run and LR ladder) takes the number from there, so ``auto`` never leaves
this module. A composed config that was not prepared (a claim's planned job, a test's) gets its spec resolved
by :func:`spec_of` when asked.

What is not here yet, and why: the init std is the model's own (an arch may override the rule: model/gpt.py),
and the run's length and warmup depend on the data's vocabulary, known when the run is built (train/build.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from normbench.config import lr_rule


@dataclass(frozen=True)
class RunSpec:
    lr: float  # optim.lr as the number the optimizer is built with (auto: lr_ref x lr_ref_width / width)
    lr_source: str  # where it came from: "optim.lr=auto (0.0006 x 768/64)" or "optim.lr=0.002"
    matrix_lr: float  # the hidden matrices' peak LR: lr, times muP's d_base/d for an Adam-like optimizer


def run_spec(cfg: Any) -> RunSpec:
    """The resolved spec of ``cfg`` (typed or composed); ConfigError (one line) where a rule cannot apply."""
    return RunSpec(
        lr=lr_rule.resolve(cfg.optim, cfg.model),
        lr_source=lr_rule.source(cfg.optim, cfg.model),
        matrix_lr=lr_rule.matrix_lr(cfg),
    )


def spec_of(cfg: Any) -> RunSpec:
    """``cfg.spec`` as :func:`normbench.validation.prepare` set it; resolved now for a composed config that was not
    prepared (a claim's planned job, a test's config): the same rule either way."""
    spec = getattr(cfg, "spec", None) if not isinstance(cfg, DictConfig) else None
    return spec if spec is not None else run_spec(cfg)
