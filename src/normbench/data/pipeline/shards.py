"""Token shards in llm.c's format: written a piece at a time, read back as memory maps.

A shard is a header of 256 little-endian int32 (``[0]`` the magic, ``[1]`` the version, ``[2]`` the
token count, the rest zero) followed by the tokens: uint16 for magic 20240520 / version 1 (GPT-2
sized vocabularies) and uint32 for magic 20240801 / version 7 (llama-3 sized ones). That is the layout
of llm.c's ``dev/data/data_common.py`` (and of modded-nanogpt's ``fineweb.py``, which writes the
uint16 form), so their shards are read here as they are and ours by them.

The writer is hand-written (a header and a numpy ``tofile``): no library writes this format. It
streams: tokens go to a temp file as they come, the header's count is filled in, the file is
fsynced and renamed to its final name, so a reader never sees a half-written shard.
:class:`Concatenated` lets the sampler (data/batches.py) index a list of shards as one array.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from normbench.errors import DataError

HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
# (magic, version) -> token dtype, as llm.c's data_common.py
FORMATS = {(20240520, 1): np.dtype("<u2"), (20240801, 7): np.dtype("<u4")}


def header_for(dtype: np.dtype, n_tokens: int) -> np.ndarray:
    magic, version = next(k for k, v in FORMATS.items() if v == np.dtype(dtype).newbyteorder("<"))
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = magic, version, n_tokens
    return header


def read_shard(path: Path) -> np.ndarray:
    """The tokens of the shard at ``path`` as a read-only memmap; a wrong or truncated header, or a
    size that does not match its count, is one line naming the file."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            header = np.frombuffer(f.read(HEADER_BYTES), dtype="<i4")
    except OSError as e:
        raise DataError(f"shard {path} cannot be read ({e.strerror or e})") from None
    if size < HEADER_BYTES:
        raise DataError(f"shard {path} is truncated ({size} bytes, shorter than the 1024-byte header); remove it")
    dtype = FORMATS.get((int(header[0]), int(header[1])))
    if dtype is None:
        raise DataError(
            f"shard {path} has no llm.c header (magic {int(header[0])}, version {int(header[1])}; expected "
            "20240520/1 for uint16 or 20240801/7 for uint32 tokens): not a token shard"
        )
    n = int(header[2])
    if size != HEADER_BYTES + n * dtype.itemsize:
        raise DataError(
            f"shard {path} is truncated or padded: its header says {n} tokens ({HEADER_BYTES + n * dtype.itemsize}"
            f" bytes) but the file has {size} bytes; remove it and prepare again"
        )
    return np.memmap(path, dtype=dtype, mode="r", offset=HEADER_BYTES, shape=(n,))


class ShardWriter:
    """One shard being written: ``write`` appends tokens to a temp file beside ``path``; ``close``
    fills in the header, fsyncs and renames it into place and returns its sha256 (of the whole file)."""

    def __init__(self, path: Path, dtype: np.dtype, resume_tokens: int = 0):
        self.path, self.dtype = Path(path), np.dtype(dtype).newbyteorder("<")
        self.tmp = self.path.with_name(f".{self.path.name}.partial")
        self.n = 0
        if resume_tokens:  # an interrupted prepare: keep what the last checkpoint had written
            self.f = open(self.tmp, "r+b")
            self.f.truncate(HEADER_BYTES + resume_tokens * self.dtype.itemsize)
            self.f.seek(0, os.SEEK_END)
            self.n = resume_tokens
        else:
            self.f = open(self.tmp, "wb")
            header_for(self.dtype, 0).tofile(self.f)

    def write(self, ids: np.ndarray) -> None:
        self.f.write(np.ascontiguousarray(ids, dtype=self.dtype).tobytes())
        self.n += len(ids)

    def sync(self) -> int:
        """Flush to disk; the token count that a resume may keep."""
        self.f.flush()
        os.fsync(self.f.fileno())
        return self.n

    def close(self) -> str:
        self.f.seek(0)
        header_for(self.dtype, self.n).tofile(self.f)
        self.sync()
        self.f.close()
        os.replace(self.tmp, self.path)
        return file_sha256(self.path)

    def abandon(self) -> None:
        self.f.close()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


class Concatenated:
    """Shards indexed as one 1-D array (what :class:`~normbench.data.batches.Batches` and the
    validation windows read): ``len``, integer-array indexing of any shape (a window may span two
    shards), slices, ``dtype`` and ``np.asarray``."""

    def __init__(self, parts: list[np.ndarray]):
        self.parts = parts
        self.ends = np.cumsum([len(p) for p in parts])
        self.dtype = np.result_type(*[p.dtype for p in parts])

    def __len__(self) -> int:
        return int(self.ends[-1])

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.__getitem__(np.arange(*index.indices(len(self))))
        index = np.asarray(index)
        flat = index.ravel()
        which = np.searchsorted(self.ends, flat, side="right")
        out = np.empty(flat.shape, dtype=self.dtype)
        for k in np.unique(which):
            sel = which == k
            out[sel] = self.parts[k][flat[sel] - (self.ends[k] - len(self.parts[k]))]
        return out.reshape(index.shape)

    def __array__(self, dtype=None, copy=None):
        out = np.concatenate([np.asarray(p) for p in self.parts])
        return out if dtype is None else out.astype(dtype)


def concatenated(parts: list[np.ndarray]):
    """One array for a list of shards: the shard itself when there is one (a plain memmap)."""
    return parts[0] if len(parts) == 1 else Concatenated(parts)
