"""The checks ``normbench train`` runs on its overrides before Hydra sees them.

Hydra reports a bad override as a multi-line traceback, and only once a run (or, in a sweep,
the job that holds the bad value) starts. Here the overrides are parsed against Hydra's grammar,
the config is composed for the first value of every sweep and then once for each other sweep
value, and each composed config goes through the same typed conversion and validation the trainer
gets (``validation.to_config``: the one pass, arch x norm combinations included), plus the checks that need the whole
command line: options of config groups (``hydra/...`` ones too), keys appended with ``+``, ``nan``
anywhere, a run or sweep directory that cannot be written, a run directory a live run holds. A
failure is a :class:`ConfigError` with one line naming the key and what is allowed;
``cli.train_cli`` prints it and exits with status 2 before any work.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import shlex
from pathlib import Path

from normbench.config.files import GROUPS, config_dir, options
from normbench.errors import ConfigError, first_line
from normbench.run.lock import RunLock


def _flat_keys(node, prefix: str = "") -> list[str]:
    from omegaconf import DictConfig  # deferred (start-up time): omegaconf

    keys = []
    for k in node.keys() if isinstance(node, DictConfig) else []:
        full = f"{prefix}{k}"
        keys.append(full)
        keys += _flat_keys(node._get_node(k), full + ".")
    return keys


def not_an_option(key: str, value: str, allowed: list[str]) -> str:
    """``norm=rmsnrom is not an option (did you mean rmsnorm?); choose one of: ...``."""
    near = difflib.get_close_matches(value, allowed, n=1, cutoff=0.6)
    hint = f" (did you mean {near[0]}?)" if near else ""
    return f"{key}={value} is not an option{hint}; choose one of: {', '.join(allowed) or '(none)'}"


CONVERSION = {"Float": "a number", "Integer": "a whole number", "Boolean": "true or false"}


def _conversion(key: str, msg: str, override: str | None, base_cfg) -> str | None:
    """OmegaConf's "Value 'abc' of type 'str' could not be converted to Float" in our words, with the
    key's current value as an example."""

    found = re.search(r"could not be converted to (\w+)", msg)
    if not found or found.group(1) not in CONVERSION:
        return None
    from omegaconf import OmegaConf  # deferred (start-up time): omegaconf

    given = override.split("=", 1)[1] if override and "=" in override else "?"
    now = OmegaConf.select(base_cfg, key, default=None) if base_cfg is not None else None
    example = f" (e.g. {key}={now})" if now is not None else ""
    return f"{key}={given} is not {CONVERSION[found.group(1)]}: {key} takes {CONVERSION[found.group(1)]}{example}"


def _unknown_key(key: str, base_keys: list[str]) -> str:
    near = difflib.get_close_matches(key, base_keys, n=1, cutoff=0.6)
    hint = f" (did you mean '{near[0]}'?)" if near else " (see `python -m normbench train --cfg job`)"
    return f"unknown config key '{key}'{hint}"


def _explain(exc: Exception, override: str | None, base_keys: list[str], base_cfg=None) -> str:
    """One line out of Hydra/OmegaConf's multi-line composition errors."""
    from omegaconf.errors import ConfigKeyError, ValidationError  # deferred (start-up time): omegaconf

    cause = exc
    while cause.__cause__ is not None and not isinstance(cause, (ValidationError, ConfigKeyError)):
        cause = cause.__cause__
    text = str(exc)
    if isinstance(cause, ConfigKeyError) or "not in struct" in text or "Could not override" in text:
        return _unknown_key(override.split("=", 1)[0].lstrip("+~") if override else "?", base_keys)
    if isinstance(cause, ValidationError):
        msg = str(cause).splitlines()[0]
        full_key = getattr(cause, "full_key", None) or (override.split("=", 1)[0] if override else "?")
        return _conversion(full_key, msg, override, base_cfg) or f"{full_key}: {msg}"
    first = first_line(exc, type(exc).__name__)
    return f"{override}: {first}" if override and override.split("=", 1)[0] not in first else first


def expand_sweep(overrides: list[str], extra_dirs: tuple[Path, ...] = ()) -> list[list[str]]:
    """Override lists to compose: the first value of every sweep, then each other sweep value once."""
    from hydra.core.override_parser.overrides_parser import OverridesParser  # deferred (start-up time): hydra
    from hydra.core.override_parser.types import Glob  # deferred (start-up time): hydra

    parsed = OverridesParser.create().parse_overrides(overrides)
    base, sweeps = [], []
    for i, o in enumerate(parsed):
        if o.is_sweep_override():
            if not o.is_discrete_sweep():  # interval(...): an optuna search space; check its key at the low end
                base.append(f"{o.get_key_element()}={o.value().start}")
                continue
            if isinstance(o.value(), Glob):  # arch=glob(*): the group's options
                values = o.value().filter(options(o.get_key_element(), extra_dirs))
            else:
                values = list(o.sweep_string_iterator())
            if not values:
                continue
            base.append(f"{o.get_key_element()}={values[0]}")
            sweeps.append((i, o.get_key_element(), values[1:]))
        else:
            base.append(overrides[i])
    variants = [base]
    for i, key, values in sweeps:
        for v in values:
            variant = list(base)
            variant[i] = f"{key}={v}"
            variants.append(variant)
    return variants


def prevalidate(overrides: list[str], extra_dirs: tuple[Path, ...] = ()) -> None:
    """Compose and validate the config for ``overrides``; raises ConfigError with one line."""
    from hydra import compose, initialize_config_dir  # deferred (start-up time): hydra
    from hydra.core.global_hydra import GlobalHydra  # deferred (start-up time): hydra
    from hydra.errors import OverrideParseException  # deferred (start-up time): hydra

    from normbench.validation import to_config  # deferred (start-up time): torch, hydra, omegaconf

    user = [o for o in overrides if not o.lstrip("+~").startswith("hydra")]
    for o in user:
        key, _, value = o.partition("=")
        if key in GROUPS and value and value != "null" and "(" not in value:  # glob(...)/choice(...): below
            for v in value.split(","):
                allowed = options(key, extra_dirs)
                if v not in allowed:
                    raise ConfigError(not_an_option(key, v, allowed))
    searchpath = [f"hydra.searchpath=[{','.join('file://' + str(d) for d in extra_dirs)}]"] if extra_dirs else []
    try:
        variants = [searchpath + v for v in expand_sweep(user, extra_dirs)]
    except OverrideParseException as exc:
        raise ConfigError(f"cannot parse the overrides: {str(exc).splitlines()[0]}") from None
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3", job_name="train"):
        base_cfg = compose(config_name="config", overrides=searchpath)
        base_keys = _flat_keys(base_cfg)
        _check_hydra_groups(overrides)
        _check_appended_keys(user, base_keys, extra_dirs)
        for variant in variants:
            try:
                cfg = compose(config_name="config", overrides=variant)
            except Exception as exc:
                bad = _first_bad(variant)
                raise ConfigError(_explain(exc, bad, base_keys, base_cfg)) from None
            _reject_nan(cfg)
            cfg = to_config(cfg)  # the same typed config and one validation pass the trainer gets
            if cfg.device == "cuda" or cfg.precision in ("fp16", "bf16"):  # what this machine cannot run
                from normbench.train.build import resolve_device  # deferred (start-up time): torch, hydra, omegaconf

                resolve_device(cfg)
    GlobalHydra.instance().clear()


def _check_appended_keys(user: list[str], base_keys: list[str], extra_dirs: tuple[Path, ...]) -> None:
    """``+trainer.max_step=1`` appends a key the schema does not know, which nothing would read:
    refused like any unknown key (a ``+group=option`` of a config group stays allowed)."""
    for o in user:
        if not o.startswith("+"):
            continue
        key = o.lstrip("+").partition("=")[0]
        if key in base_keys or (("." not in key) and options(key, extra_dirs)):
            continue
        raise ConfigError(f"{_unknown_key(key, base_keys)}; '+' cannot add keys that normbench never reads")


def _check_hydra_groups(overrides: list[str]) -> None:
    """``hydra/launcher=...`` and the like: an unknown option is one line here, not Hydra's 14."""
    from hydra.core.global_hydra import GlobalHydra  # deferred (start-up time): hydra

    loader = GlobalHydra.instance().config_loader()
    for o in overrides:
        key, _, value = o.lstrip("+").partition("=")
        if key.startswith("hydra/") and value and value != "null" and "(" not in value:
            allowed = loader.get_group_options(key)
            for v in value.split(","):
                if v not in allowed:
                    raise ConfigError(not_an_option(key, v, allowed))


def _reject_nan(cfg) -> None:
    """``nan`` passes every ``< 0`` / ``== 0`` check, so it is refused for every key up front
    (and an interpolation that cannot be resolved, e.g. ``${oc.env:UNSET}``, is one line too)."""
    from omegaconf import OmegaConf  # deferred (start-up time): omegaconf
    from omegaconf.errors import OmegaConfBaseException  # deferred (start-up time): omegaconf

    try:
        container = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as exc:
        first = first_line(exc, type(exc).__name__)
        raise ConfigError(f"{getattr(exc, 'full_key', None) or 'config'}: {first}") from None

    def walk(node, prefix: str) -> None:
        for k, v in node.items() if isinstance(node, dict) else enumerate(node):
            if isinstance(v, (dict, list)):
                walk(v, f"{prefix}{k}.")
            elif isinstance(v, float) and math.isnan(v):
                raise ConfigError(f"{prefix}{k}=nan is not a number; give a finite value")

    walk(container, "")


def _first_bad(variant: list[str]) -> str | None:
    """The override that breaks composition (composing them one at a time)."""
    from hydra import compose  # deferred (start-up time): hydra

    for i in range(len(variant)):
        try:
            compose(config_name="config", overrides=variant[: i + 1])
        except Exception:
            return variant[i]
    return None


def check_override_syntax(overrides: list[str]) -> None:
    """Hydra's override grammar, checked for every override (``hydra.*`` ones too) before Hydra parses
    them: an unquoted non-ASCII or special character is one line with the quoting that works."""
    from hydra.core.override_parser.overrides_parser import OverridesParser  # deferred (start-up time): hydra
    from hydra.errors import OverrideParseException  # deferred (start-up time): hydra

    parser = OverridesParser.create()
    for o in overrides:
        try:
            parser.parse_overrides([o])
        except OverrideParseException:
            key, _, value = o.partition("=")
            fix = f"{key}='{value}'" if "'" not in value else f'{key}="{value}"'
            shell = f'"{fix}"' if not set(fix) & set('"$`\\!') else shlex.quote(fix)
            raise ConfigError(
                f"cannot parse the override {o}: quote the value for Hydra and the whole override for the shell, "
                f"e.g. {shell} (grammar: https://hydra.cc/docs/advanced/override_grammar/basic)"
            ) from None


def sweep_without_m(message: str) -> str | None:
    """Hydra's refusal of a sweep override in a single run (``model=tiny,small`` without ``-m``; an experiment
    that is a multirun by its own config is not one) as one line with the three things it can mean; None
    for any other message. Hydra decides, from the composed ``hydra.mode``; this only says it better."""
    found = re.match(r"Ambiguous value for argument '(.+?)'", message)
    if not found:
        return None
    o = found.group(1)
    key, _, value = o.partition("=")
    sweep = f"{o} is a sweep (one job per value): add -m (python -m normbench train -m {o} ...)"
    if key.lstrip("+~") in GROUPS or key.startswith("hydra/"):  # a config group takes one option: -m is the fix
        return f"{sweep}; {key} is a config group, so a single run takes one of its options"
    return f"{sweep}; for one value that is a list write {key}=[{value}], for a string quote it: \"{key}='{value}'\""


def check_output_dir_writable(argv: list[str]) -> None:
    """The run (or sweep) directory, or the nearest existing directory above it, must be writable:
    Hydra would otherwise fail with a traceback while creating it."""
    multirun = any(a in ("-m", "--multirun") for a in argv)
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    given = [a.split("=", 1)[1] for a in argv if a.startswith(f"{key}=")]
    target = Path(given[-1].strip("'\"")) if given and "${" not in given[-1] else Path("outputs")
    try:  # try it, rather than os.access: root passes access checks that a read-only mount still fails
        target.mkdir(parents=True, exist_ok=True)
        probe = target / f".normbench-write-test-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        why = "a file is in the way" if isinstance(exc, (FileExistsError, NotADirectoryError)) else exc.strerror
        raise ConfigError(
            f"cannot write the {'sweep' if multirun else 'run'} directory {target} ({why}); choose a writable "
            f"one with {key}=DIR{'' if given else ' or run from a writable directory'}"
        ) from None


def check_run_dir_free(argv: list[str]) -> None:
    """A single run into an explicit ``hydra.run.dir`` that a live run holds is refused before Hydra
    rewrites that directory's ``.hydra/`` (the lock itself is taken in ``trainer.run``)."""
    if any(a in ("-m", "--multirun") for a in argv) or int(os.environ.get("WORLD_SIZE", 1)) > 1:
        return
    dirs = [a.split("=", 1)[1] for a in argv if a.startswith("hydra.run.dir=")]
    if dirs and "${" not in dirs[-1]:
        RunLock(dirs[-1]).check_free()
