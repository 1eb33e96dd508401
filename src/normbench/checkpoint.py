"""Atomic checkpoints: write to a temp file, fsync, rename over ``last.pt``.

A crash at any instant leaves either the previous complete ``last.pt`` or the
new complete one, never a torn file (the rename is atomic on POSIX). Loading
uses ``torch.load(weights_only=True)``: a checkpoint from a stranger cannot run
code. Anything unreadable is refused with one line naming the file.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from normbench.errors import ConfigError


def save_atomic(state: dict, path: Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def load(path: Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"trainer.resume: no checkpoint at {path}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # truncated, random bytes, or pickled code: all refused the same way
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"checkpoint {path} is unreadable or not a normbench checkpoint ({first[:160]})") from None
    if not isinstance(state, dict) or "model" not in state or "step" not in state:
        raise ConfigError(f"checkpoint {path} is not a normbench checkpoint (no model/step entries)")
    return state
