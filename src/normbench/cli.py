"""``python -m normbench {train,report,list,reproduce}``.

``train`` is a Hydra app over ``conf/config.yaml``: every Hydra flag works
(``-m``, ``--cfg job``, ``--help``, ``hydra/launcher=...``). Before Hydra runs,
the overrides are composed once here (each sweep value too) and validated, so a
typo, a wrong type or an impossible value ends before any work with one line:
``normbench: error: <key>...: <what is allowed>`` and exit status 2.
"""

from __future__ import annotations

import difflib
import logging
import math
import os
import re
import shlex
import signal
import sys
import textwrap
from pathlib import Path

from omegaconf import OmegaConf

from normbench.errors import ConfigError, first_line
from normbench.rundir import job_dir_name

# sweep job directories: hydra.sweep.subdir in conf/config.yaml (registered here, at import, so that a
# launcher's worker process that unpickles run_job has it too)
OmegaConf.register_new_resolver("nb_job_dir", job_dir_name, replace=True)

GROUPS = ("model", "arch", "norm", "optim", "sched", "data", "diag", "logger", "experiment")
FLAGS_WITH_VALUE = (
    "-cp",
    "--config-path",
    "-cn",
    "--config-name",
    "-cd",
    "--config-dir",
    "-p",
    "--package",
    "--experimental-rerun",
    "--cfg",
    "-c",
)
HYDRA_FLAGS_NO_VALIDATE = ("--help", "-h", "--hydra-help", "--info", "-i", "--shell-completion", "-sc", "--version")

USAGE = """usage: python -m normbench {train,report,list,export,sample,reproduce} ...

  train [overrides...]        one run (Hydra app; add -m for a sweep, --help for the config)
  train -m k=a,b ...          a Hydra multirun sweep
  report DIR [DIR ...]        tables and figures for every run below the DIRs (--help: flags)
  list [GROUP]                the options of each config group, with their papers
  export RUN_DIR OUT_DIR      the run's model as a directory Hugging Face transformers loads
  sample RUN_DIR --prompt T   text from the run's checkpoint (--hf: through transformers)
  reproduce {--list|ID|all}   run a paper's claim and give its verdict (--help: options)
"""


def config_dir() -> Path:
    """``conf/`` of a source checkout, else the copy shipped inside the package."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parent.parent / "conf", here / "conf"):
        if (candidate / "config.yaml").is_file():
            return candidate
    raise FileNotFoundError("normbench's conf/ directory was not found (broken install?)")


def options(group: str, extra_dirs: tuple[Path, ...] = ()) -> list[str]:
    dirs = (config_dir(), *extra_dirs)
    return sorted({p.stem for d in dirs for p in (d / group).glob("*.yaml")})


def user_config_dirs(argv: list[str]) -> tuple[Path, ...]:
    """Directories given with Hydra's ``--config-dir``/``-cd`` (a user overlay on conf/)."""
    dirs = []
    for i, a in enumerate(argv):
        if a in ("--config-dir", "-cd") and i + 1 < len(argv):
            dirs.append(Path(argv[i + 1]).resolve())
        elif a.startswith("--config-dir="):
            dirs.append(Path(a.split("=", 1)[1]).resolve())
    return tuple(dirs)


def error(msg: str) -> int:
    if int(os.environ.get("RANK", 0)) == 0:  # under torchrun, one line, not one per rank
        print(f"normbench: error: {msg}", file=sys.stderr)
    return 2


def compose_config(overrides: list[str] | None = None):
    """The composed, schema-checked config for ``overrides``, as `train` sees it (no run)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from normbench.config import register_configs

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3", job_name="train"):
        cfg = compose(config_name="config", overrides=list(overrides or []))
    GlobalHydra.instance().clear()
    return cfg


# ----------------------------------------------------------------------------- list
_CITES = re.compile(r"arXiv|et al\.|\b(19|20)\d\d\b|\b[A-Za-z][A-Za-z0-9-]{2,}/[A-Za-z][\w.-]{2,}")
_SENTENCE_END = re.compile(r"(?<!al\.)(?<!e\.g\.)(?<!i\.e\.)(?<!vs\.)(?<=[.?!])\s+(?=[A-Za-z(`])")
_LIST_WIDTH = 150  # characters of description per option in `normbench list`


def describe(path: Path) -> str:
    """A config file's first sentence, plus the sentence that cites its source if that is another one."""
    header = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line.startswith("#"):
            break
        if not line.startswith("# @package"):
            header.append(line.lstrip("# ").strip())
    sentences = _SENTENCE_END.split(" ".join(header))
    if not sentences or not sentences[0]:
        return ""
    first = sentences[0]
    if _CITES.search(first):
        return textwrap.shorten(first, _LIST_WIDTH, placeholder=" ...")
    ref = next((s for s in sentences[1:] if _CITES.search(s)), "")
    if not ref:
        return textwrap.shorten(first, _LIST_WIDTH, placeholder=" ...")
    ref = textwrap.shorten(ref.rstrip("."), 70, placeholder=" ...")
    return f"{textwrap.shorten(first, max(90, _LIST_WIDTH - len(ref) - 4), placeholder=' ...')}  [{ref}]"


def list_cli(argv: list[str]) -> int:
    groups = argv or list(GROUPS)
    for group in groups:
        if group not in GROUPS:
            return error(f"unknown group {group!r}; choose one of: {', '.join(GROUPS)}")
    from normbench import config

    registries = {"arch": config.archs, "norm": config.norms, "optim": config.optims}
    for group in groups:
        print(f"{group}:")
        for opt in options(group):
            print(f"  {opt:<16} {describe(config_dir() / group / f'{opt}.yaml')}")
        # registered without a conf file (a NORMBENCH_PLUGINS module): chosen with <group>.name=...
        for name in registries[group]() if group in registries else ():
            if name not in options(group):
                print(f"  {name:<16} registered in code, no conf/{group}/{name}.yaml: choose with {group}.name={name}")
    return 0


# ---------------------------------------------------------------------------- train
def _flat_keys(node, prefix: str = "") -> list[str]:
    from omegaconf import DictConfig

    keys = []
    for k in node.keys() if isinstance(node, DictConfig) else []:
        full = f"{prefix}{k}"
        keys.append(full)
        keys += _flat_keys(node._get_node(k), full + ".")
    return keys


def _unknown_key(key: str, base_keys: list[str]) -> str:
    near = difflib.get_close_matches(key, base_keys, n=1, cutoff=0.6)
    hint = f" (did you mean '{near[0]}'?)" if near else " (see `python -m normbench train --cfg job`)"
    return f"unknown config key '{key}'{hint}"


def _explain(exc: Exception, override: str | None, base_keys: list[str]) -> str:
    """One line out of Hydra/OmegaConf's multi-line composition errors."""
    from omegaconf.errors import ConfigKeyError, ValidationError

    cause = exc
    while cause.__cause__ is not None and not isinstance(cause, (ValidationError, ConfigKeyError)):
        cause = cause.__cause__
    text = str(exc)
    if isinstance(cause, ConfigKeyError) or "not in struct" in text or "Could not override" in text:
        return _unknown_key(override.split("=", 1)[0].lstrip("+~") if override else "?", base_keys)
    if isinstance(cause, ValidationError):
        msg = str(cause).splitlines()[0]
        full_key = getattr(cause, "full_key", None) or (override.split("=", 1)[0] if override else "?")
        return f"{full_key}: {msg}"
    first = first_line(exc, type(exc).__name__)
    return f"{override}: {first}" if override and override.split("=", 1)[0] not in first else first


def _expand(overrides: list[str], extra_dirs: tuple[Path, ...] = ()) -> list[list[str]]:
    """Override lists to compose: the first value of every sweep, then each other sweep value once."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Glob

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
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import OverrideParseException

    from normbench.config import to_config
    from normbench.model import check_combination

    user = [o for o in overrides if not o.lstrip("+~").startswith("hydra")]
    for o in user:
        key, _, value = o.partition("=")
        if key in GROUPS and value and value != "null" and "(" not in value:  # glob(...)/choice(...): below
            for v in value.split(","):
                allowed = options(key, extra_dirs)
                if v not in allowed:
                    raise ConfigError(f"{key}={v} is not an option; choose one of: {', '.join(allowed)}")
    searchpath = [f"hydra.searchpath=[{','.join('file://' + str(d) for d in extra_dirs)}]"] if extra_dirs else []
    try:
        variants = [searchpath + v for v in _expand(user, extra_dirs)]
    except OverrideParseException as exc:
        raise ConfigError(f"cannot parse the overrides: {str(exc).splitlines()[0]}") from None
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3", job_name="train"):
        base_keys = _flat_keys(compose(config_name="config", overrides=searchpath))
        _check_hydra_groups(overrides)
        _check_appended_keys(user, base_keys, extra_dirs)
        for variant in variants:
            try:
                cfg = compose(config_name="config", overrides=variant)
            except Exception as exc:
                bad = _first_bad(variant)
                raise ConfigError(_explain(exc, bad, base_keys)) from None
            _reject_nan(cfg)
            cfg = to_config(cfg)  # the same typed, validated config the trainer gets
            check_combination(cfg)
            if cfg.device == "cuda" or cfg.precision == "fp16":
                from normbench.build import resolve_device

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
    from hydra.core.global_hydra import GlobalHydra

    loader = GlobalHydra.instance().config_loader()
    for o in overrides:
        key, _, value = o.lstrip("+").partition("=")
        if key.startswith("hydra/") and value and value != "null" and "(" not in value:
            allowed = loader.get_group_options(key)
            for v in value.split(","):
                if v not in allowed:
                    raise ConfigError(f"{key}={v} is not an option; choose one of: {', '.join(allowed) or '(none)'}")


def _reject_nan(cfg) -> None:
    """``nan`` passes every ``< 0`` / ``== 0`` check, so it is refused for every key up front
    (and an interpolation that cannot be resolved, e.g. ``${oc.env:UNSET}``, is one line too)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

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
    from hydra import compose

    for i in range(len(variant)):
        try:
            compose(config_name="config", overrides=variant[: i + 1])
        except Exception:
            return variant[i]
    return None


def _torchrun_overrides(argv: list[str]) -> list[str]:
    """Under torchrun all ranks share one run dir and only rank 0 writes Hydra's files."""
    if int(os.environ.get("WORLD_SIZE", 1)) <= 1:
        return []
    if any(a in ("-m", "--multirun") for a in argv):
        raise ConfigError("torchrun with -m: sweep outside, DDP inside (launch torchrun once per job)")
    extra = []
    if not any(a.startswith("hydra.run.dir=") for a in argv):
        run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
        extra.append(f"hydra.run.dir=outputs/runs/torchrun-{run_id}")
    if int(os.environ.get("RANK", 0)) != 0:
        extra.append("hydra.output_subdir=null")
    return extra


def train_cli(argv: list[str]) -> int:
    import hydra
    from omegaconf import DictConfig

    from normbench.config import register_configs
    from normbench.signals import STOP

    register_configs()
    info_only = any(a in HYDRA_FLAGS_NO_VALIDATE for a in argv)
    show_cfg = any(a.startswith("--cfg") or a == "-c" for a in argv)  # --cfg job: printed only if valid
    overrides = [a for a in argv if not a.startswith("-") and "=" in a]
    _ARGV[:] = argv
    try:
        _check_override_syntax(overrides)
        argv = argv + _torchrun_overrides(argv)
        for prev, a in zip(["-"] + argv, argv):
            if not info_only and "=" not in a and not a.startswith("-") and prev not in FLAGS_WITH_VALUE:
                raise ConfigError(f"cannot parse '{a}': an override is key=value (e.g. {a}=...)")
        if not info_only:
            prevalidate(overrides, user_config_dirs(argv))
        if not info_only and not show_cfg:
            _check_output_dir_writable(argv)
            _check_run_dir_free(argv)
    except ConfigError as exc:
        return error(str(exc))

    @hydra.main(config_path=str(config_dir()), config_name="config", version_base="1.3")
    def _train(cfg: DictConfig) -> float:
        return run_job(cfg)

    saved = sys.argv
    sys.argv = ["normbench train"] + argv
    _REFUSED.clear()
    # a stop signal is honoured for the whole command: between a sweep's jobs it ends the sweep
    installed = STOP.install([signal.SIGTERM, signal.SIGINT])
    try:
        _train()
    finally:
        STOP.uninstall(installed)
        sys.argv = saved
    return 2 if _REFUSED else 0


_REFUSED: list[str] = []  # run_job notes a refused single run here
_ARGV: list[str] = []  # the train command's arguments, for the resume command printed at an interrupt
_SAFE_VALUE = re.compile(r"[A-Za-z0-9_./:+@%-]*")


def _check_override_syntax(overrides: list[str]) -> None:
    """Hydra's override grammar, checked for every override (``hydra.*`` ones too) before Hydra parses
    them: an unquoted non-ASCII or special character is one line with the quoting that works."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

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


def _check_output_dir_writable(argv: list[str]) -> None:
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


def _hydra_value(value: str) -> str:
    """``value`` as Hydra's grammar reads it back (quoted when it holds special characters)."""
    if _SAFE_VALUE.fullmatch(value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def resume_command(run_dir: Path, sweep_dir: Path | None = None) -> str:
    """The command that resumes this run (or, with ``sweep_dir``, the whole sweep)."""
    drop = ("trainer.resume=", "hydra.run.dir=", "hydra.sweep.dir=")
    args = [a for a in _ARGV if not a.startswith(drop)]
    key, path = ("hydra.sweep.dir", sweep_dir) if sweep_dir else ("hydra.run.dir", run_dir)
    where = f"{key}={_hydra_value(str(path))}"
    prefix = ["python", "-m", "normbench", "train"]
    if int(os.environ.get("WORLD_SIZE", 1)) > 1:
        prefix = ["torchrun", f"--nproc_per_node={os.environ.get('LOCAL_WORLD_SIZE', 1)}", "-m", "normbench", "train"]
    return " ".join(shlex.quote(a) for a in [*prefix, *args, where, "trainer.resume=true"])


def _check_run_dir_free(argv: list[str]) -> None:
    """A single run into an explicit ``hydra.run.dir`` that a live run holds is refused before Hydra
    rewrites that directory's ``.hydra/`` (the lock itself is taken in ``trainer.run``)."""
    if any(a in ("-m", "--multirun") for a in argv) or int(os.environ.get("WORLD_SIZE", 1)) > 1:
        return
    dirs = [a.split("=", 1)[1] for a in argv if a.startswith("hydra.run.dir=")]
    if dirs and "${" not in dirs[-1]:
        from normbench.rundir import RunDir

        RunDir(dirs[-1]).lock().check_free()


def run_job(cfg) -> float:
    """One Hydra job. Returns the value an optimizing sweeper minimizes (best val loss)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from normbench import trainer
    from normbench.callbacks import Refused
    from normbench.rundir import RunDir, RunDirInUse
    from normbench.signals import STOP

    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    multirun = hc.mode == RunMode.MULTIRUN
    sweep_dir = _sweep_dir(hc, run_dir) if multirun else None
    STOP.hint = f"resume {'the sweep' if multirun else 'this run'} with: {resume_command(run_dir.resolve(), sweep_dir)}"
    try:
        summary = trainer.run(cfg, run_dir)
    except ConfigError as exc:
        error(str(exc))
        if not multirun:  # callbacks.KeepHydraFiles puts the run directory's .hydra/ back
            _REFUSED.append(str(exc))
            return Refused(str(exc))
        if not isinstance(exc, RunDirInUse):  # that directory's summary belongs to the live run
            RunDir(run_dir).record_failure(cfg, str(exc))
        return math.inf
    except trainer.Interrupted as exc:
        logging.getLogger("normbench").warning("%s", STOP.hint)
        sys.exit(128 + int(getattr(signal, str(exc), signal.SIGINT)))  # 143 for SIGTERM, 130 for SIGINT
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:
        if not multirun:
            raise
        # a failed job is a result of the sweep, not its end
        first = first_line(exc)
        print(f"normbench: job {hc.job.num} failed: {type(exc).__name__}: {first}", file=sys.stderr)
        if RunDir(run_dir).status() == "interrupted":  # checkpointed first, then the launcher gave up
            return math.inf  # the summary says so already; trainer.resume=true continues it
        RunDir(run_dir).record_failure(cfg, f"{type(exc).__name__}: {first}"[:300])
        return math.inf
    if STOP.signum is not None:  # it came after the run's last safe point: the run is done; stop here
        then = f"no further jobs start; {STOP.hint}" if multirun else "exiting"
        name = signal.Signals(STOP.signum).name
        logging.getLogger("normbench").warning("%s arrived as the run %s: %s", name, summary["status"], then)
        sys.exit(128 + STOP.signum)
    if summary["status"] != "completed" or summary.get("best_val_loss") is None:
        return 1e6  # diverged: clearly worse than any real loss, not a crash
    return float(summary["best_val_loss"])


def _sweep_dir(hc, run_dir: Path) -> Path:
    """The sweep directory holding this job's directory (absolute)."""
    sweep = OmegaConf.select(hc, "sweep.dir", default=None)
    if sweep is not None and Path(str(sweep)).resolve() in run_dir.resolve().parents:
        return Path(str(sweep)).resolve()
    return run_dir.resolve().parent


def load_plugins() -> None:
    """Import the modules named in ``NORMBENCH_PLUGINS`` (comma-separated) before any command runs:
    the hook point for code that lives outside the package, e.g. a module that calls
    ``register_norm`` for a norm of its own, or wraps one of the trainer's extension points."""
    import importlib

    for name in filter(None, (n.strip() for n in os.environ.get("NORMBENCH_PLUGINS", "").split(","))):
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ConfigError(f"NORMBENCH_PLUGINS: cannot import {name!r} ({first_line(exc)})") from None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        load_plugins()
    except ConfigError as exc:
        return error(str(exc))
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "train":
        return train_cli(rest)
    if cmd == "report":
        from normbench.report import main as report_main

        return report_main(rest)
    if cmd == "list":
        return list_cli(rest)
    if cmd in ("export", "sample"):
        from normbench.export.cli import export_main, sample_main

        return export_main(rest) if cmd == "export" else sample_main(rest)
    if cmd == "reproduce":
        from normbench.reproduce import main as reproduce_main

        return reproduce_main(rest)
    return error(f"unknown command {cmd!r}; choose one of: train, report, list, export, sample, reproduce")


def entry() -> None:
    """The ``normbench`` command and ``python -m normbench``: run ``main`` and leave with its code.

    A torchrun worker skips the interpreter's teardown (``os._exit`` after flushing): the
    process group is destroyed and every file closed by then, but gloo's C++ worker threads
    can still be joinable when static destructors run, which aborts the process (SIGABRT,
    "terminate called without an active exception"; about one FSDP run in 15 on 2 CPU cores)
    and torchrun reports a finished run as failed.
    """
    try:
        code = main()
    except SystemExit as exc:  # Hydra and the CLI end with sys.exit on errors
        code = exc.code
    except BrokenPipeError:  # `normbench list | head`: the reader left; no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 1
    if int(os.environ.get("WORLD_SIZE", 1)) > 1:
        logging.shutdown()
        if isinstance(code, str):  # what sys.exit would have printed
            print(code, file=sys.stderr)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(code if isinstance(code, int) else (0 if code is None else 1))
    sys.exit(code)
