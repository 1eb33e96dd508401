"""Shared test helpers: offline environment, config composition, running the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "WANDB_MODE": "offline",
    "WANDB_SILENT": "true",
}
os.environ.update(OFFLINE_ENV)
os.environ.setdefault("NORMBENCH_CACHE", str(REPO / ".cache" / "normbench"))
# the trainings the tests start (`python -m normbench` subprocesses) on one thread too (see `one_thread`): under
# pytest-xdist two workers share the cores, and two-thread OpenMP barriers on a shared core stall each other
os.environ.setdefault("OMP_NUM_THREADS", "1")
# the fault-injection hooks (normbench_test_hooks.py): in this process, and in every `python -m normbench`
# the tests start (NORMBENCH_PLUGINS, with this directory on their PYTHONPATH)
_TESTS = str(Path(__file__).resolve().parent)
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_TESTS, os.environ.get("PYTHONPATH")) if p)
os.environ["NORMBENCH_PLUGINS"] = "normbench_test_hooks"
import normbench_test_hooks  # noqa: E402, F401  (installs the hooks)


def compose(overrides: list[str] | None = None):
    """The composed, schema-checked config for ``overrides`` (as `train` would see it)."""
    from normbench.config.files import compose_config

    return compose_config(overrides)


def run_cli(args: list[str], cwd: Path, timeout: float = 300, env: dict | None = None, check: bool = False):
    """``python -m normbench ARGS`` in a subprocess; returns CompletedProcess (text)."""
    full_env = {**os.environ, **OFFLINE_ENV, **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "normbench", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"normbench {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


TINY = ["model=tiny", "trainer.batch_size=8", "diag.every=10", "trainer.log_every=5", "trainer.eval_every=10"]


@pytest.fixture
def tiny_cfg():
    """A tiny config for in-process runs; call with extra overrides."""

    def make(*overrides: str):
        return compose([*TINY, *overrides])

    return make


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    """Tiny models run fastest single-threaded, and the machine's cores are shared."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(autouse=True)
def _drop_log_handlers():
    """In-process runs attach console/file handlers to captured streams; drop them afterwards."""
    yield
    import logging

    logger = logging.getLogger("normbench")
    for h in list(logger.handlers):
        logger.removeHandler(h)
        h.close()
