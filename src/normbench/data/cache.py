"""Where token caches live, and the lock that lets one process of many build an entry."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from normbench.data.texts import abs_path, cfg_value


def cache_root(cfg: Any) -> Path:
    root = cfg_value(cfg, "cache_dir") or os.environ.get("NORMBENCH_CACHE") or "~/.cache/normbench"
    return abs_path(root)


def fmt(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 100_000 else f"{n / 1e3:.1f}k" if n >= 1000 else str(n)


@contextlib.contextmanager
def entry_lock(root: Path, entry: Path, log: Callable[[str], Any] | None = None):
    """An exclusive flock on ``root/.<entry>.lock`` (released by the kernel if the process dies). When
    another process holds it, ``log`` says so before this one waits."""
    fd = os.open(root / f".{entry.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if log is not None:
                    log(f"another process (a sweep job or another node) is preparing {entry.name}; waiting for it")
                fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:  # a filesystem without flock: rename's atomicity is all we have
            pass
        yield
    finally:
        os.close(fd)
