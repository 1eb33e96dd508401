"""Atomic checkpoints: write to a temp file, fsync, rename over ``last.pt``.

A crash at any instant leaves either the previous complete ``last.pt`` or the
new complete one, never a torn file (the rename is atomic on POSIX; the
directory is fsynced after it). A temp file left by a killed writer is removed
by the next save. Loading uses ``torch.load(weights_only=True)``: a checkpoint
from a stranger cannot run code. Anything unreadable is refused with one line
naming the file.

Integrity: ``torch.save`` writes a zip archive (stored, uncompressed) whose every record
carries the CRC-32 of its bytes; :func:`verify` has Python's ``zipfile`` recompute them all
(``ZipFile.testzip``) before anything is unpickled, so a flipped byte anywhere in the pickle
or in a tensor's data is refused instead of trained on or exported (``torch.load`` itself never
checks them). The zip CRCs are used rather than a sha256 written beside the file because they
are already inside it, written by torch and checked by the standard library: nothing new to
keep atomic alongside ``last.pt`` (two renames are not one; a crash between them would leave a
good checkpoint with a stale digest), and a copied checkpoint carries them with it. CRC-32 is a
check against damage (disk, copy, truncation, a stray write), not against deliberate
tampering; ``weights_only=True`` is what keeps a stranger's file from running code.
:func:`serialize` therefore always saves with torch's CRC-32s on.

:func:`serialize` writes the state into the open temp file (tests wrap it to tear a write).
"""

from __future__ import annotations

import os
import re
import warnings
import zipfile
import zlib
from pathlib import Path

import torch

from normbench.errors import ConfigError, first_line
from normbench.run.metrics import write_atomic

TMP_MARK = ".tmp."
RESTORE = "restore a good copy, or delete it to start over"


# What a resume reads unconditionally (train/state.py: TrainState.resume and load_state_dict).
REQUIRED_KEYS = ("model", "optimizer", "step", "tokens", "sampler_rng", "torch_rng")
# What a sharded checkpoint's extra.pt must hold (train/sharded.py: the model and optimizer are DCP's shards).
REQUIRED_EXTRA = REQUIRED_KEYS[2:]


def _tmp_path(path: Path) -> Path:
    return path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}")


def _remove_stale_tmp(path: Path) -> None:
    """Temp files of earlier writers of ``path`` that were killed mid-write (only one run owns a directory)."""
    mine = _tmp_path(path).name
    for stale in path.parent.glob(f".{path.name}{TMP_MARK}*"):
        if stale.name != mine:
            stale.unlink(missing_ok=True)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def serialize(state: dict, f) -> None:
    """``torch.save`` with its per-record CRC-32s on (``torch.serialization.set_crc32_options(False)``
    elsewhere in the process would write zeros, which :func:`verify` refuses)."""
    crc = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(True)
    try:
        torch.save(state, f)
    finally:
        torch.serialization.set_crc32_options(crc)


def save_atomic(state: dict, path: Path) -> None:
    """Write ``state`` to ``path`` so that ``path`` is always either the old or the new complete file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp(path)
    write_atomic(path, lambda f: serialize(state, f), binary=True)
    fsync_dir(path.parent)


def _why(exc: BaseException) -> str:
    text = str(exc)
    found = re.search(r"GLOBAL (\S+)", text) or re.search(r"Unsupported (?:global|operand|class)[: ]+(\S+)", text)
    if found:
        return f"it holds pickled objects other than tensors and plain data ({found.group(1).rstrip('.:,')})"
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(exc).__name__)
    return first[:160]


def verify(path: Path) -> None:
    """Check every record of the ``torch.save`` archive at ``path`` against its CRC-32 (and the zip's
    structure); :class:`ConfigError`, one line naming the file and the record, otherwise. Reads only."""
    try:
        with zipfile.ZipFile(path) as archive:
            sized = [info for info in archive.infolist() if info.file_size]
            if sized and not any(info.CRC for info in sized):
                raise ConfigError(
                    f"checkpoint {path} carries no CRC-32s (saved with torch.serialization.set_crc32_options(False)), "
                    "so its content cannot be verified; save it again with CRC-32s on"
                )
            bad = archive.testzip()  # reads every record, recomputing its CRC-32; the first bad one's name
    except ConfigError:
        raise
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError, RuntimeError, zlib.error) as exc:
        why = first_line(exc, type(exc).__name__)[:120]
        raise ConfigError(f"checkpoint {path} is truncated or corrupt ({why}); {RESTORE}") from None
    if bad is not None:
        raise ConfigError(
            f"checkpoint {path} is corrupt: its record {bad} fails the zip's CRC-32 check "
            f"(its bytes changed after torch.save wrote them); {RESTORE}"
        )


def load(path: Path, required: tuple[str, ...] = REQUIRED_KEYS) -> dict:
    """The state dict of a normbench checkpoint file holding the ``required`` keys; :class:`ConfigError`
    (one line, naming the file) otherwise."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"trainer.resume: no checkpoint at {path}")
    try:
        is_archive = zipfile.is_zipfile(path)
    except OSError as exc:
        raise ConfigError(f"checkpoint {path} cannot be read ({exc.strerror or exc})") from None
    if not is_archive:  # torch.save always writes a zip archive; never unpickle anything else
        raise ConfigError(f"checkpoint {path} is truncated or corrupt (not a complete torch.save archive); {RESTORE}")
    verify(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's pickle-protocol warnings would break the one-line error
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # corrupt members or pickled code: refused the same way
        raise ConfigError(
            f"checkpoint {path} was refused: {_why(exc)}; normbench loads checkpoints with weights_only=True"
        ) from None
    if not isinstance(state, dict):
        raise ConfigError(f"checkpoint {path} is not a normbench checkpoint (not a dict)")
    missing = [k for k in required if k not in state]
    if missing:
        raise ConfigError(f"checkpoint {path} is not a normbench checkpoint (no {', '.join(missing)} entries)")
    return state
