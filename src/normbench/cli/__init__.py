"""``python -m normbench {train,report,list,reproduce}``.

``train`` is a Hydra app over ``conf/config.yaml``: every Hydra flag works
(``-m``, ``--cfg job``, ``--help``, ``hydra/launcher=...``). Before Hydra runs, the
overrides are composed once (each sweep value too) and validated (:mod:`normbench.cli.overrides`),
so a typo, a wrong type or an impossible value ends before any work with one line:
``normbench: error: <key>...: <what is allowed>`` and exit status 2.
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import signal
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from normbench.cli.listing import list_cli
from normbench.cli.overrides import (
    check_output_dir_writable,
    check_override_syntax,
    check_run_dir_free,
    prevalidate,
    sweep_without_m,
)
from normbench.cli.prepare import prepare_cli
from normbench.config.files import config_dir, user_config_dirs
from normbench.downstream.cli import main as eval_main
from normbench.errors import ConfigError, error, first_line
from normbench.run import commands
from normbench.run.lock import RunDirInUse
from normbench.run.rundir import RunDir, job_dir_name

# sweep job directories: hydra.sweep.subdir in conf/config.yaml (registered here, at import, so that a
# launcher's worker process that unpickles run_job has it too)
OmegaConf.register_new_resolver("nb_job_dir", job_dir_name, replace=True)

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

USAGE = """usage: python -m normbench {train,prepare,report,list,export,sample,eval,reproduce,coordcheck} ...

  train [overrides...]        one run (Hydra app; add -m for a sweep, --help for the config)
  train -m k=a,b ...          a Hydra multirun sweep
  prepare data=... [data.*]   a corpus' token shards, made before training (--help: the keys)
  report DIR [DIR ...]        tables and figures for every run below the DIRs (--help: flags)
  list [GROUP]                the options of each config group, with their papers
  export RUN_DIR OUT_DIR      the run's model as a directory Hugging Face transformers loads
  sample RUN_DIR --prompt T   text from the run's checkpoint (--hf: through transformers)
  eval RUN_DIR ... --tasks T  downstream scores (lm-evaluation-harness) into each run's eval.json
  reproduce {--list|ID|all}   run a paper's claim and give its verdict (--help: options)
  coordcheck [--widths ...]   muP's coordinate check, SP and muP side by side (--help: options)
"""


# ---------------------------------------------------------------------------- train


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
    import hydra  # deferred (start-up time): hydra

    from normbench.config.schema import register_configs  # deferred (start-up time): hydra

    register_configs()
    info_only = any(a in HYDRA_FLAGS_NO_VALIDATE for a in argv)
    show_cfg = any(a.startswith("--cfg") or a == "-c" for a in argv)  # --cfg job: printed only if valid
    overrides = [a for a in argv if not a.startswith("-") and "=" in a]
    _ARGV[:] = argv
    try:
        check_override_syntax(overrides)
        argv = argv + _torchrun_overrides(argv)
        for prev, a in zip(["-"] + argv, argv):
            if not info_only and "=" not in a and not a.startswith("-") and prev not in FLAGS_WITH_VALUE:
                raise ConfigError(f"cannot parse '{a}': an override is key=value (e.g. {a}=...)")
        if not info_only:
            prevalidate(overrides, user_config_dirs(argv))
        if not info_only and not show_cfg:
            check_output_dir_writable(argv)
            check_run_dir_free(argv)
    except ConfigError as exc:
        return error(str(exc))

    @hydra.main(config_path=str(config_dir()), config_name="config", version_base="1.3")
    def _train(cfg: DictConfig) -> float:
        return run_job(cfg)

    return _run_hydra(_train, argv)


def _run_hydra(app, argv: list[str]) -> int:
    """Run the Hydra app ``app`` on ``argv``: a stop signal is honoured for the whole command (between a
    sweep's jobs it ends the sweep), and Hydra's own errors (a config it cannot load, a sweeper or
    launcher setting) come back as exceptions instead of Hydra's printout and exit 1, so that they are
    one line and exit 2 like every other bad input; a job's own crash (a bug) keeps its traceback."""
    from normbench.train.signals import STOP  # deferred (start-up time): torch

    saved, full_error = sys.argv, os.environ.get("HYDRA_FULL_ERROR")
    sys.argv = ["normbench train"] + argv
    _REFUSED.clear()
    _JOB_STARTED.clear()
    os.environ["HYDRA_FULL_ERROR"] = "1"
    installed = STOP.install([signal.SIGTERM, signal.SIGINT])
    try:
        app()
    except Exception as exc:
        if _JOB_STARTED:
            raise
        if sweep := sweep_without_m(first_line(exc, "")):
            return error(sweep)
        cause = f": {first_line(exc.__cause__)}" if exc.__cause__ is not None and first_line(exc.__cause__) else ""
        return error(f"{first_line(exc, type(exc).__name__)}{cause} (from Hydra, before any job started)")
    finally:
        STOP.uninstall(installed)
        sys.argv = saved
        if full_error is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = full_error
    return 2 if _REFUSED else 0


_REFUSED: list[str] = []  # run_job notes a refused single run here
_JOB_STARTED: list[bool] = []  # run_job notes here that Hydra got as far as a job
_ARGV: list[str] = []  # the train command's arguments, for the resume command printed at an interrupt


def resume_command(run_dir: Path, sweep_dir: Path | None = None) -> str:
    """The command that resumes this run (or, with ``sweep_dir``, the whole sweep)."""
    prefix = commands.TRAIN
    if int(os.environ.get("WORLD_SIZE", 1)) > 1:
        prefix = ("torchrun", f"--nproc_per_node={os.environ.get('LOCAL_WORLD_SIZE', 1)}", "-m", "normbench", "train")
    return commands.resume_command(_ARGV, run_dir, sweep_dir, prefix)


def run_job(cfg) -> float:
    """One Hydra job. Returns the value an optimizing sweeper minimizes (best val loss)."""
    from hydra.core.hydra_config import HydraConfig  # deferred (start-up time): hydra
    from hydra.types import RunMode  # deferred (start-up time): hydra

    from normbench.run.callbacks import Refused  # deferred (start-up time): hydra
    from normbench.train import trainer  # deferred (start-up time): torch, hydra, numpy
    from normbench.train.signals import STOP  # deferred (start-up time): torch

    _JOB_STARTED.append(True)
    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    multirun = hc.mode == RunMode.MULTIRUN
    sweep_dir = _sweep_dir(hc, run_dir) if multirun else None
    STOP.hint = f"resume {'the sweep' if multirun else 'this run'} with: {resume_command(run_dir.resolve(), sweep_dir)}"
    try:
        summary = trainer.run(cfg, run_dir, callbacks=_callbacks(cfg))
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


def _callbacks(cfg) -> list:
    """The trainer's callbacks: in-training downstream evaluation where ``eval.tasks`` names tasks."""
    if not OmegaConf.select(cfg, "eval.tasks"):
        return []
    from normbench.downstream.callback import DownstreamEval  # lm-eval: the optional `eval` extra

    return [DownstreamEval(cfg)]


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
    if cmd == "prepare":
        return prepare_cli(rest)
    if cmd == "report":
        from normbench.report import main as report_main  # deferred (start-up time): torch, hydra, numpy

        return report_main(rest)
    if cmd == "list":
        return list_cli(rest)
    if cmd in ("export", "sample"):
        from normbench.export.cli import export_main, sample_main  # deferred (start-up time): torch

        return export_main(rest) if cmd == "export" else sample_main(rest)
    if cmd == "eval":
        return eval_main(rest)
    if cmd == "reproduce":
        from normbench.reproduce import main as reproduce_main  # deferred (start-up time): torch, hydra, numpy

        return reproduce_main(rest)
    if cmd == "coordcheck":
        from normbench.diag.coordcheck import main as coordcheck_main  # deferred (start-up time): torch

        return coordcheck_main(rest)
    commands_ = "train, prepare, report, list, export, sample, eval, reproduce, coordcheck"
    return error(f"unknown command {cmd!r}; choose one of: {commands_}")


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
