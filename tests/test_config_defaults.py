"""One value for each default (config/schema.py's docstring): the schema holds the types.

A key that conf/config.yaml sets has no value in the schema (``???``); a group key's schema default is the value
of the group's default option, and any yaml that restates a default restates the same value. So the schema and
the composed config can never disagree on a default (issue 54: five keys did, e.g. ``optim.lr`` 1e-3 in the
schema against 2e-3 in conf/optim/adamw.yaml)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from normbench.config.files import compose_config
from normbench.config.schema import schema_node
from normbench.run.resume import flat_config

CONF = Path(__file__).resolve().parents[1] / "conf"
GROUPS = ("model", "arch", "norm", "optim", "sched", "data", "diag", "logger")
UNSET = "???"


def flat(node: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in node.items():
        if isinstance(value, dict) and value:
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def yaml_keys(path: Path, prefix: str = "") -> dict:
    """The keys a conf/ file sets (its defaults list and hydra's section aside), flat, under ``prefix``."""
    raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return flat({k: v for k, v in raw.items() if k not in ("defaults", "hydra")}, prefix)


def schema_values() -> dict:
    """The schema's flat defaults, ``???`` where the yaml is the home."""
    return flat(OmegaConf.to_container(OmegaConf.structured(schema_node()), resolve=False))


def default_options() -> dict[str, str]:
    """{group: the option conf/config.yaml's defaults list picks}."""
    raw = yaml.safe_load((CONF / "config.yaml").read_text(encoding="utf-8"))
    picked = {}
    for item in raw["defaults"]:
        if isinstance(item, dict):
            ((group, option),) = item.items()
            if group in GROUPS:
                picked[group] = option
    return picked


def disagreements(schema: dict, set_by_yaml: dict) -> list[str]:
    """Keys the yaml sets to a value other than the schema's (a schema without a value, ``???``, never disagrees)."""
    return [
        f"{k}: schema {schema[k]!r}, yaml {v!r}"
        for k, v in set_by_yaml.items()
        if k in schema and schema[k] != UNSET and schema[k] != v
    ]


def options(group: str) -> list[Path]:
    return sorted((CONF / group).glob("*.yaml"))


def test_disagreements_finds_a_key_the_two_homes_set_differently():
    schema = {"optim.lr": 1e-3, "optim.name": UNSET, "trainer.max_steps": 200}
    assert disagreements(schema, {"optim.lr": 2e-3, "optim.name": "adamw", "trainer.max_steps": 200}) == [
        "optim.lr: schema 0.001, yaml 0.002"
    ]


def test_the_schema_and_the_default_composition_never_disagree():
    schema = schema_values()
    set_by_yaml = yaml_keys(CONF / "config.yaml")
    for group, option in default_options().items():
        set_by_yaml.update(yaml_keys(CONF / group / f"{option}.yaml", f"{group}."))
    assert not disagreements(schema, set_by_yaml)
    composed = flat_config(compose_config([]))
    for key, value in schema.items():  # a key no yaml sets takes the schema's value, and the schema's only
        if key not in set_by_yaml and value != UNSET:
            assert composed[key] == value, key
    assert {k for k, v in schema.items() if v == UNSET} <= set(set_by_yaml)  # every home-less key has one


def test_config_yaml_keys_have_no_schema_value_and_group_defaults_are_the_default_options():
    """A key conf/config.yaml sets lives in the yaml only; a group key's schema default is its default option's
    value, so a group option (a user's overlay too) sets only what it changes."""
    schema = schema_values()
    for key in yaml_keys(CONF / "config.yaml"):
        assert schema[key] == UNSET, f"{key} has a value in config.yaml and in the schema"
    for group, option in default_options().items():
        for key, value in yaml_keys(CONF / group / f"{option}.yaml", f"{group}.").items():
            assert schema[key] == value, f"{key}: schema {schema[key]!r}, conf/{group}/{option}.yaml {value!r}"


@pytest.mark.parametrize("group", GROUPS)
def test_every_option_composes_with_no_key_left_unset(group):
    """An option's own values may differ from the schema's defaults (that is what an option is for); it must set
    every key that has no schema value, and only keys the schema declares."""
    schema = schema_values()
    for path in options(group):
        cfg = compose_config([f"{group}={path.stem}"])
        assert not OmegaConf.missing_keys(cfg), f"{group}={path.stem} leaves {sorted(OmegaConf.missing_keys(cfg))}"
        assert set(yaml_keys(path, f"{group}.")) <= set(schema), f"{path}: keys the schema lacks"
