"""A run's ``checkpoints/`` directory: which checkpoint is the run's, in either format.

Two formats live there (docs/contract.md §3): the single file ``last.pt`` (train/checkpoint.py: one
process and DDP, where every rank holds the whole state) and sharded DCP directories
``step_<N>.dcp`` (train/sharded.py: FSDP2). A run can change between them on resume (DDP to FSDP
and back), so the run's checkpoint is the newest complete one of either: :func:`latest`. After a
checkpoint is committed, :func:`prune` removes the ones it supersedes (never a ``trainer.save_at``
branch point), so one of each kind is never left to be mistaken for the other.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import warnings
from pathlib import Path

import torch

from normbench.train import checkpoint as ckpt
from normbench.train import sharded

log = logging.getLogger("normbench")

LAST = "last.pt"


def _file_step(path: Path) -> float:
    """The step of ``last.pt`` for choosing between formats; an unreadable one counts as the newest, so
    that a resume refuses it in its own line instead of quietly going back to an older checkpoint."""

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            step = torch.load(path, map_location="cpu", weights_only=True, mmap=True).get("step")
    except Exception:  # refused by the load that follows, in one line
        return float("inf")
    return step if type(step) is int else float("inf")


def latest(ckpt_dir: Path) -> Path | None:
    """The run's checkpoint: ``last.pt`` or the newest complete ``step_<N>.dcp``, whichever is at the
    later step (the file when both are); None when there is neither."""
    ckpt_dir = Path(ckpt_dir)
    dirs = sharded.committed(ckpt_dir)
    newest = max(dirs) if dirs else None
    file = ckpt_dir / LAST
    if file.exists() and (newest is None or _file_step(file) >= newest):
        return file
    return dirs[newest] if newest is not None else None


def load(path: Path) -> dict:
    """The checkpoint at ``path`` (a file or a sharded directory) as one flat dict, full tensors on CPU."""
    return sharded.load_full(path) if Path(path).is_dir() else ckpt.load(path)


def prune(ckpt_dir: Path, newest: Path, keep: frozenset[int]) -> None:
    """Rank 0, after ``newest`` was committed: remove the checkpoints it supersedes (the other format's
    ``last.pt`` or older ``step_<N>.dcp``), keeping the steps of ``keep`` (``trainer.save_at``)."""
    ckpt_dir = Path(ckpt_dir)
    for step, path in sharded.committed(ckpt_dir).items():
        if path != newest and step not in keep:
            shutil.rmtree(path, ignore_errors=True)
    if newest.is_dir():
        (ckpt_dir / LAST).unlink(missing_ok=True)


def set_aside(ckpt_dir: Path) -> None:
    """A fresh run (``trainer.resume=false``) in a used directory: its old checkpoints are renamed so that a
    later resume cannot pick them up, and nothing is deleted."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    old = [Path(ckpt_dir) / LAST, *sharded.committed(ckpt_dir).values()]
    for path in [p for p in old if p.exists()]:
        kept = path.with_name(f"replaced-{stamp}.pt" if path.name == LAST else f"replaced-{stamp}-{path.name}")
        os.replace(path, kept)
        log.warning("trainer.resume=false: starting over; the old checkpoint is now %s", kept)
