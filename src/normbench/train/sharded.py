"""Sharded checkpoints: ``torch.distributed.checkpoint`` (DCP), the home of FSDP2 runs.

Under FSDP2 every rank holds a shard of each parameter and of its optimizer state. A single file
would need the whole state gathered onto rank 0 first (~12 GB at 1B) and read back whole by every
rank on resume; DCP writes each rank's own shards to its own file and reads back only what a rank
needs, re-sharding to any world size (torchtitan ``components/checkpoint.py``; the torch docs of
``torch.distributed.checkpoint``). A checkpoint of step N is the directory ``step_<N>.dcp``:

- ``__<rank>_0.distcp``: each rank's shards of ``model`` and ``optimizer`` (the sharded state dicts of
  ``torch.distributed.checkpoint.state_dict``, keyed by parameter name as the single file's);
- ``.metadata``: DCP's index of every shard, written last by rank 0 once every rank's data is written
  and fsynced;
- ``extra.pt``: everything else a resume needs (train/state.py: step, data position, every rank's RNG,
  scaler, counters, summary, config) in the single-file format of train/checkpoint.py: CRC-32s checked,
  loaded with ``weights_only=True``. Small: every rank reads it.

Completeness: the directory is written as ``.step_<N>.dcp.tmp`` and renamed by rank 0 once DCP has
written its ``.metadata``; only renamed directories are candidates (train/ckpt_store.py), and a temp
directory left by a killed run is removed by the next save. A resume checks ``extra.pt``'s CRC-32s,
reads ``.metadata`` with an unpickler that admits only DCP's own metadata classes (DCP itself uses
plain ``pickle``: a stranger's file could run code), and checks that every shard file holds the bytes
the index names; anything else is refused in one line. DCP's shard files carry no checksums, so a
flipped bit inside a shard is not caught as the single file's CRC-32s catch it (docs/contract.md §3).

``async_save``: the state is copied to CPU memory (the only part on the training's critical path) and
written by a background thread; :func:`save` returns its future.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import pathlib
import pickle
import re
import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

from normbench.errors import ConfigError, first_line
from normbench.train import checkpoint as ckpt

SUFFIX = ".dcp"
EXTRA = "extra.pt"
METADATA = ".metadata"
_NAME = re.compile(r"step_(\d+)\.dcp")


def path_for(ckpt_dir: Path, step: int) -> Path:
    return Path(ckpt_dir) / f"step_{step}{SUFFIX}"


def step_of(path: Path) -> int | None:
    found = _NAME.fullmatch(Path(path).name)
    return int(found.group(1)) if found else None


def committed(ckpt_dir: Path) -> dict[int, Path]:
    """The complete sharded checkpoints in ``ckpt_dir`` by step (renamed, with DCP's index)."""
    found = {}
    for path in Path(ckpt_dir).glob(f"step_*{SUFFIX}"):
        step = step_of(path)
        if step is not None and (path / METADATA).is_file():
            found[step] = path
    return found


def _tmp(final: Path) -> Path:
    return final.with_name(f".{final.name}.tmp")


def _optimizers(optimizer) -> list:
    return list(getattr(optimizer, "optimizers", None) or (optimizer,))


def tensors(model: torch.nn.Module, optimizer) -> dict:
    """This rank's shards of the model and optimizer (every rank calls it; no communication under FSDP2).
    Before the first step the optimizer has no state to save (torch would make one with a zero-lr step)."""
    state = {"model": get_model_state_dict(model)}
    optims = _optimizers(optimizer)
    if any(opt.state for opt in optims):
        state["optimizer"] = get_optimizer_state_dict(model, optims)
    return state


def save(final: Path, state: dict, extra: dict | None, group=None, background: bool = False):
    """Write ``state`` (:func:`tensors`) and rank 0's ``extra`` as the checkpoint ``final``: collective.

    ``background``: ``dcp.async_save`` (``group``: a process group with a CPU backend); returns its future,
    whose completion :func:`commit` must follow on rank 0. Otherwise written and committed here; None."""
    final, tmp = Path(final), _tmp(Path(final))
    main = not dist.is_initialized() or dist.get_rank() == 0
    if main:
        for stale in final.parent.glob(f".step_*{SUFFIX}.tmp"):  # killed writers' (one run owns the directory)
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir(parents=True)
        extra = {**extra, "optimizer_saved": "optimizer" in state}
        ckpt.save_atomic(extra, tmp / EXTRA)
    if dist.is_initialized():
        dist.barrier()  # the temp directory exists (and no stale one) before any rank writes into it
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP's "assuming a single process" in one process
        if background:
            return dcp.async_save(state, checkpoint_id=tmp, process_group=group)
        dcp.save(state, checkpoint_id=tmp)
    if main:
        commit(final)
    return None


def commit(final: Path) -> None:
    """Rank 0, once DCP's save has returned (its index written): the checkpoint becomes a candidate."""
    final = Path(final)
    if final.exists():  # the same step written again (a resumed run that had been killed after it)
        shutil.rmtree(final)
    os.replace(_tmp(final), final)
    ckpt.fsync_dir(final.parent)


def read_extra(path: Path) -> dict:
    """``extra.pt`` of the checkpoint ``path``, CRC-32s checked; ConfigError (one line) otherwise."""
    extra_path = Path(path) / EXTRA
    if not extra_path.is_file():
        raise ConfigError(f"checkpoint {path} is incomplete (no {EXTRA}); {ckpt.RESTORE}")
    return ckpt.load(extra_path, required=ckpt.REQUIRED_EXTRA)


class _MetadataUnpickler(pickle.Unpickler):
    """Admits DCP's own metadata classes (dataclasses and enums), torch's dtypes and sizes, and paths."""

    def find_class(self, module: str, name: str):
        obj = super().find_class(module, name)
        if module.startswith("torch.distributed.checkpoint.") and isinstance(obj, type):
            if dataclasses.is_dataclass(obj) or issubclass(obj, enum.Enum):
                return obj
        if module == "torch" and (isinstance(obj, torch.dtype) or obj is torch.Size):
            return obj
        if (module, name) == ("torch.serialization", "_get_layout"):
            return obj
        if module == "pathlib" and obj in (pathlib.PosixPath, pathlib.PurePosixPath):
            return obj
        raise pickle.UnpicklingError(f"holds pickled objects other than DCP's metadata ({module}.{name})")


class SafeReader(dcp.FileSystemReader):
    """DCP's reader with its index read by :class:`_MetadataUnpickler` instead of plain ``pickle``."""

    def read_metadata(self, *args, **kwargs):
        path = Path(self.path) / METADATA
        with open(path, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = dcp.metadata.StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def verify(path: Path) -> None:
    """The index readable and every shard file holding the bytes it names; ConfigError (one line) otherwise."""
    try:
        metadata = SafeReader(path).read_metadata()
        storage = metadata.storage_data
        ends: dict[str, int] = {}
        for info in storage.values():
            ends[info.relative_path] = max(ends.get(info.relative_path, 0), info.offset + info.length)
    except Exception as exc:  # truncated, corrupt or foreign index: refused the same way
        raise ConfigError(f"checkpoint {path} was refused: its {METADATA} {_why(exc)}; {ckpt.RESTORE}") from None
    for name, end in sorted(ends.items()):
        shard = Path(path) / name
        size = shard.stat().st_size if shard.is_file() else None
        if size is None or size < end:
            what = "is missing" if size is None else f"is truncated ({size} of {end} bytes)"
            raise ConfigError(f"checkpoint {path} is incomplete: its shard {name} {what}; {ckpt.RESTORE}")


def _why(exc: BaseException) -> str:
    if isinstance(exc, pickle.UnpicklingError) and str(exc).startswith("holds"):
        return str(exc)
    return f"cannot be read ({first_line(exc, type(exc).__name__)[:120]})"


def _load(state: dict, path: Path) -> None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.load(state, storage_reader=SafeReader(path))
    except Exception as exc:  # DCP wraps every rank's failure: one line, naming the checkpoint
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()] or [type(exc).__name__]
        why = next((ln for ln in lines if "Missing key" in ln or "Size mismatch" in ln or "size" in ln), lines[-1])
        raise ConfigError(f"checkpoint {path} does not fit this model ({why[:200]})") from None


def load_into(path: Path, model: torch.nn.Module, optimizer, with_optimizer: bool) -> None:
    """Read the checkpoint ``path`` into ``model`` (and ``optimizer`` when it was saved: ``extra``'s
    ``optimizer_saved``), sharded or not (DCP re-shards). Collective under torchrun. ConfigError (one line)
    when damaged or not fitting."""
    verify(path)
    state = {"model": get_model_state_dict(model)}
    if with_optimizer:  # the layout to read into (a fresh optimizer's: torch makes its state)
        state["optimizer"] = get_optimizer_state_dict(model, _optimizers(optimizer))
    _load(state, path)
    set_model_state_dict(model, state["model"])
    if with_optimizer:
        set_optimizer_state_dict(model, _optimizers(optimizer), state["optimizer"])


def load_full(path: Path) -> dict:
    """The checkpoint ``path`` as the single file's flat dict (full ``model`` and ``optimizer`` on CPU),
    read in one process (export, sample): what train/checkpoint.py's ``load`` returns for ``last.pt``."""
    extra = read_extra(path)
    verify(path)
    state: dict = {}
    try:  # torch's own dcp_to_torch_save reads this way: dcp.load would fill a copy of an empty dict
        _load_state_dict(state, storage_reader=SafeReader(path), planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    except Exception as exc:  # a shard that does not read: one line, naming the checkpoint
        raise ConfigError(f"checkpoint {path} was refused: {_why(exc)}; {ckpt.RESTORE}") from None
    return {**extra, "model": state.get("model", {}), "optimizer": state.get("optimizer", {})}
