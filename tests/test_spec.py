"""The run spec (config/spec.py): ``optim.lr=auto`` resolved once, in config/, and read from there."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from normbench.config.spec import RunSpec, spec_of
from normbench.errors import ConfigError
from normbench.validation import prepare

from conftest import compose

SRC = Path(__file__).resolve().parents[1] / "src" / "normbench"
# the rule's functions; only config/ (the rule, the spec) and validation.py (its limits) may call them
RESOLVERS = re.compile(r"lr_rule\.(resolve|matrix_lr|source|flat_resolved)\b|\bresolve_lr\(|\brun_spec\(")
ALLOWED = {"config/lr_rule.py", "config/spec.py", "validation.py", "run/resume.py"}


def test_prepare_resolves_auto_once_into_a_frozen_spec():
    cfg, _ = prepare(compose(["model=tiny", "optim.lr=auto"]))
    assert cfg.spec == RunSpec(lr=7.2e-3, lr_source="optim.lr=auto (0.0006 x 768/64)", matrix_lr=7.2e-3)
    assert cfg.optim.lr == "auto"  # the request stays as written (the run's config, its resume check)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.spec.lr = 1.0
    assert spec_of(cfg) is cfg.spec  # a prepared config's spec is read, not resolved again


def test_spec_under_mup_and_a_number_and_a_refused_auto():
    # muP: the scalar is the LR at d_base (64), the hidden matrices get d_base/d of it (1e-3 x 64/128 at d 128)
    spec = spec_of(compose(["model=tiny", "model.d_model=128", "model.param=mup", "optim.lr=1e-3"]))
    assert (spec.lr, spec.matrix_lr, spec.lr_source) == (1e-3, 5e-4, "optim.lr=0.001")
    with pytest.raises(ConfigError, match="optim.lr=auto .* optim=lion has no such rule"):
        prepare(compose(["model=tiny", "optim=lion", "optim.lr=auto"]))


def test_no_module_outside_config_and_validation_resolves_the_lr():
    """Readers take the number from the spec; the rule is called in config/ and validation.py only (and by
    run/resume.py on old runs' flat configs, which have no spec: the resume check compares numbers)."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel in ALLOWED:
            continue
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if RESOLVERS.search(line) or re.search(r"""\.lr\s*==\s*["']auto["']|AUTO\b""", line):
                found.append(f"{rel}:{i}: {line.strip()}")
    assert not found, "\n".join(found)
    assert RESOLVERS.search("    lr = lr_rule.resolve(cfg.optim, cfg.model)")  # the pattern catches the old form
