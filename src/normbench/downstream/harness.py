"""Driving lm-evaluation-harness: the task index, the task names checked, one run scored into ``eval.json``.

The harness's ``TaskManager`` indexes every task it ships (about 15,000 YAML files, tens of seconds);
tasks that all come from ``--include-path`` are looked up there alone (``include_defaults=False``). An
unknown name is one line with the close matches (difflib over the index). Task data comes through
``datasets`` (docs/scale-out.md §8: carrying it to an air-gapped node); data the cache lacks offline is
one line too. The harness is imported here only after :func:`normbench.downstream.require_harness`.
"""

from __future__ import annotations

import contextlib
import difflib
import logging
from pathlib import Path

import torch

from normbench.errors import ConfigError, first_line
from normbench.export.run import load_run, run_tokenizer
from normbench.run.eval_file import task_records, write_eval

OFFLINE_DOC = "docs/scale-out.md §8 says how to bring the standard tasks' data to an offline node"


def task_manager(tasks: list[str], include_path: str | None = None, include_defaults: bool = True):
    """A ``TaskManager`` that knows every name in ``tasks``; ConfigError naming an unknown one.
    ``include_defaults=False``: the tasks of ``include_path`` only (the tests: no 15,000-file index)."""
    from lm_eval.tasks import TaskManager  # the optional `eval` extra

    if include_path is not None and not Path(include_path).is_dir():
        raise ConfigError(f"--include-path {include_path}: not a directory (a folder of lm-eval task YAML files)")
    manager = None
    if include_path is not None:
        manager = TaskManager(include_path=include_path, include_defaults=False)
        if not include_defaults or all(t in manager.all_tasks for t in tasks):
            include_defaults = False
    if include_defaults:
        manager = TaskManager(include_path=include_path)
    for task in tasks:
        if task not in manager.all_tasks:
            close = difflib.get_close_matches(task, manager.all_tasks, n=4, cutoff=0.6)
            hint = f"close: {', '.join(close)}" if close else "lm-eval --tasks list names them all"
            where = f" or in {include_path}" if include_path else ""
            raise ConfigError(f"--tasks {task}: no such task in lm-evaluation-harness{where} ({hint})")
    return manager


def run_device(cfg, device: str | None) -> torch.device:
    """The run's device (its ``device`` key, resolved as the trainer does) unless ``device`` names one."""
    from normbench.train.build import resolve_device  # deferred (start-up time): hydra, omegaconf, numpy

    if device is not None:
        cfg = cfg.copy()
        cfg.device = device
    return resolve_device(cfg)


def evaluate_run(run_dir, tasks: list[str], manager, limit=None, batch_size: int = 32, device: str | None = None):
    """Score the run at ``run_dir`` on ``tasks``; writes and returns its ``eval.json`` data."""
    import lm_eval  # the optional `eval` extra

    from normbench.downstream.lm import NormbenchLM  # optional dependency (the eval extra)
    from normbench.runtime.precision import autocast_dtype, precision_name  # deferred (start-up time): omegaconf

    run = load_run(run_dir)
    dev = run_device(run.cfg, device)
    dtype = autocast_dtype(run.cfg)
    autocast = (lambda: torch.autocast(dev.type, dtype=dtype)) if dtype else contextlib.nullcontext
    lm = NormbenchLM(run.model.to(dev), run_tokenizer(run.cfg), autocast, batch_size)
    logging.getLogger("lm_eval").setLevel(logging.WARNING)  # its per-task INFO lines; warnings stay
    try:
        out = lm_eval.simple_evaluate(
            model=lm, tasks=tasks, task_manager=manager, limit=limit, log_samples=False, batch_size=batch_size
        )
    except (ConnectionError, OSError) as exc:  # datasets/huggingface_hub offline or unreachable: their errors
        raise ConfigError(
            f"eval: cannot load the data of {', '.join(tasks)} ({first_line(exc)[:200]}); {OFFLINE_DOC}"
        ) from None
    extra = {"limit": limit, "batch_size": batch_size, "device": dev.type, "precision": precision_name(run.cfg)}
    return write_eval(Path(run_dir), lm_eval.__version__, run.step, task_records(out, extra))
