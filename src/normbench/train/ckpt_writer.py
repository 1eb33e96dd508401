"""Writing the run's checkpoints: the single file or sharded DCP, now or in the background.

:class:`CheckpointWriter` is the one place that decides how a checkpoint is written:

- the format: sharded DCP under FSDP2 (train/sharded.py: each rank writes its own shards, nothing is
  gathered), else the single file ``last.pt`` (train/checkpoint.py: one process and DDP, where every
  rank holds the whole state; rank 0 writes it);
- ``trainer.ckpt_async``: the state is copied to CPU memory on the training's critical path and written
  by a background thread while training goes on (torchtitan's async checkpointing). Sharded: DCP's
  ``async_save`` over a gloo group of its own (its collectives run beside the training's). The single
  file: one writer thread doing what a synchronous save does (temp file, fsync, rename), because DCP's
  ``async_save`` writes only DCP's format, and the single file's CRC-32s and its readers (export,
  sample, the claims) are kept. At most one write is in flight: the next save waits for the last.

A checkpoint counts once committed (renamed into place); then the checkpoints it supersedes are pruned
(train/ckpt_store.py) and ``summary.json`` is written with the summary *as of the checkpoint's step*, so
summary.json and the checkpoint always agree (a resume truncates metrics.jsonl to that step). A
background write is committed at the first log step after it ends (:meth:`poll`) or at the next save
or the run's end (:meth:`wait`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from normbench.errors import ConfigError
from normbench.runtime.distributed import effective_parallel
from normbench.train import checkpoint as ckpt
from normbench.train import ckpt_store, sharded


def check_async_available() -> None:
    """``trainer.ckpt_async=true`` on a torch without ``torch.distributed.checkpoint.async_save``: one line."""

    if not hasattr(dcp, "async_save"):
        raise ConfigError(
            f"trainer.ckpt_async=true needs torch.distributed.checkpoint.async_save (torch >= 2.3); "
            f"this torch {torch.__version__} has none: set trainer.ckpt_async=false"
        )


def _owned(obj):
    """``obj`` with every tensor copied: on a CPU run the state dicts are views of the live parameters, which
    the training changes while a background write reads them (on a GPU run they are fresh CPU copies)."""
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, dict):
        return {k: _owned(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_owned(v) for v in obj)
    return obj


class CheckpointWriter:
    def __init__(
        self,
        ckpt_dir: Path,
        *,
        sharded: bool,
        background: bool,
        keep,
        device: torch.device,
        spent: Callable[[str, float], None] | None = None,
        write_summary: Callable[[dict], None] | None = None,
    ):
        self.dir, self.sharded, self.background = Path(ckpt_dir), sharded, background
        self.keep, self.device, self.write_summary = frozenset(keep), device, write_summary
        self.spent = spent or (lambda what, seconds: None)  # the throughput meter's ckpt_s: the training held up
        self.main = not dist.is_initialized() or dist.get_rank() == 0
        if background:
            check_async_available()
        # async DCP runs collectives from its thread: never on the group the training's collectives use
        self.group = dist.new_group(backend="gloo") if background and sharded and dist.is_initialized() else None
        self.executor = ThreadPoolExecutor(1, "normbench-ckpt") if background and not sharded else None
        self.pending: tuple[Future | None, Path, dict | None] | None = None

    @classmethod
    def for_run(cls, cfg, c, ckpt_dir: Path, meter, write_summary) -> CheckpointWriter:
        """The writer of a run (``c``: train/build.py's components): sharded DCP when FSDP2 shards the state."""
        sharded = effective_parallel(cfg) == "fsdp"
        return cls(
            ckpt_dir,
            sharded=sharded,
            background=c.settings.ckpt_async,
            keep=c.settings.save_at,
            device=c.device,
            spent=meter.spent,
            write_summary=write_summary,
        )

    def save(self, state, step: int) -> None:
        """Write the checkpoint of ``state`` (train/state.py) at ``step``: collective under torchrun."""
        t0 = time.perf_counter()
        try:
            self._save(state, step)
        finally:
            self.spent("ckpt_s", time.perf_counter() - t0)

    def _save(self, state, step: int) -> None:
        if self.pending is not None:  # at most one write in flight: the last one ends first
            self._commit()
        if self.sharded:
            tensors, extra = state.sharded_state()
            final = sharded.path_for(self.dir, step)
            future = sharded.save(final, tensors, extra, group=self.group, background=self.background)
            self.pending = (future, final, extra["summary"] if extra else None)
        else:
            full = state.state_dict()  # the whole state on rank 0, None elsewhere
            if full is None:
                return
            path = self.dir / ckpt_store.LAST
            if self.executor is not None:
                full = _owned(full) if self.device.type == "cpu" else full
                self.pending = (self.executor.submit(self._write_file, full, path, step), path, full["summary"])
            else:
                self._write_file(full, path, step)
                self.pending = (None, path, full["summary"])
        if self.pending[0] is None:
            self._commit()

    def _write_file(self, state: dict, path: Path, step: int) -> None:
        ckpt.save_atomic(state, path)
        if step in self.keep:  # a branch point (trainer.save_at): kept beside last.pt
            ckpt.save_atomic(state, path.with_name(f"step_{step}.pt"))

    def poll(self) -> None:
        """Commit a background write that has ended (at log steps: no waiting)."""
        if self.pending is not None and (self.pending[0] is None or self.pending[0].done()):
            self._commit()

    def wait(self) -> None:
        """Wait for the write in flight, if any, and commit it (its error, if it failed, is raised here)."""
        if self.pending is not None:
            t0 = time.perf_counter()
            try:
                self._commit()
            finally:
                self.spent("ckpt_s", time.perf_counter() - t0)

    def _commit(self) -> None:
        future, path, summary = self.pending
        self.pending = None
        if future is not None:
            future.result()
            if self.sharded and self.main:
                sharded.commit(path)
        if self.main:
            ckpt_store.prune(self.dir, path, self.keep)
            if self.write_summary is not None and summary is not None:
                self.write_summary(summary)

    def close(self) -> None:
        """At the run's end (also on an error): the write in flight finishes; the thread goes."""
        try:
            self.wait()
        finally:
            if self.executor is not None:
                self.executor.shutdown()
