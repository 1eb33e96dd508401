"""``prepare``: a corpus of documents turned into llm.c-format token shards, streaming and in parallel.

Documents (data/pipeline/documents.py) go in batches of about 1 MB to a pool of ``data.workers`` processes
(default: the usable cores) that tokenize them; results come back in order (a bounded window of
batches in flight, so memory stays flat however large the corpus is, and the shards do not depend on
the worker count) and are written straight into ``<name>_train_NNNNNN.bin`` / ``<name>_val_NNNNNN.bin``
of ``data.shard_tokens`` tokens each (data/shards.py). Each document starts with the tokenizer's
end-of-text id. A document is validation when the hash of its text falls below ``data.val_fraction``
(a whole held-out document, and a duplicate of it too), or when it comes from the given validation set
(``data.val_paths`` / ``data.hf_val_split``).

Once per filesystem: the entry's flock makes sweep jobs wait instead of tokenizing side by side, and
under torchrun only local rank 0 prepares while the other ranks wait for the manifest. An interrupted
prepare resumes: ``progress.json`` (written at least every 30 s and whenever a shard is finished, after
an fsync of the shard being written) records the documents done and the finished shards, which are kept.
``manifest.json``, written last, marks the entry complete: source identity, tokenizer, counts and each
shard's sha256.

References: llm.c ``dev/data/fineweb.py`` (a process pool, EOT-first documents, 100 M-token shards with
a 256-int32 header), nanoGPT ``data/openwebtext/prepare.py`` (``datasets.map`` over processes into a
uint16 memmap), OLMo-core (token memmaps built once on local rank 0 behind a barrier).
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import re
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from normbench.data.cache import cache_root, entry_lock
from normbench.data.pipeline import documents
from normbench.data.pipeline.progress import Progress
from normbench.data.pipeline.shards import ShardWriter
from normbench.data.texts import cfg_value
from normbench.data.tokenizer import DEFAULT_BPE_VOCAB, build_tokenizer, fixed_vocab, token_dtype
from normbench.errors import DataError

PREPARE_FORMAT = 1  # bump when what the shards hold changes: old entries are then ignored
BATCH_CHARS = 1 << 20  # characters of text per batch sent to a worker
CHECKPOINT_S = 30.0


def prepare_key(cfg: Any) -> dict:
    """Everything the shards depend on (not data.workers: they are the same for any count)."""
    tok = cfg_value(cfg, "tokenizer")
    given_val = bool(cfg_value(cfg, "val_paths") or cfg_value(cfg, "hf_val_split"))
    return {
        "format": PREPARE_FORMAT,
        "corpus": cfg_value(cfg, "name"),
        "source": documents.identity(cfg),
        "tokenizer": tok,
        "vocab_size": fixed_vocab(tok, cfg_value(cfg, "name"))
        or (cfg_value(cfg, "vocab_size") if tok == "bpe" else None),
        "val_fraction": None if given_val else float(cfg_value(cfg, "val_fraction")),
        "shard_tokens": int(cfg_value(cfg, "shard_tokens")),
    }


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-.") or "corpus"


def shard_prefix(cfg: Any) -> str:
    """The ``<name>`` of the shard files: the dataset's or the first path's name."""
    if cfg_value(cfg, "name") == "hf":
        return _slug(Path(str(cfg_value(cfg, "hf_path"))).name.lower())
    first = Path(str(cfg_value(cfg, "paths")[0]).rstrip("/*"))
    return _slug(first.name.split(".")[0])


def entry_path(cfg: Any) -> tuple[Path, dict]:
    key = prepare_key(cfg)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    vocab = key["vocab_size"] or ""
    return cache_root(cfg) / f"{shard_prefix(cfg)}-{_slug(key['tokenizer'])}{vocab}-{digest}", key


def read_manifest(entry: Path) -> dict | None:
    try:
        return json.loads((entry / "manifest.json").read_text())
    except (OSError, ValueError):
        return None


def _write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# ----------------------------------------------------------------------------- workers

_TOKENIZER = None


def _init_worker(spec: tuple) -> None:
    global _TOKENIZER
    name, vocab, entry = spec
    _TOKENIZER = build_tokenizer(name, vocab, None, Path(entry), eot=True)


def is_val(text: str, val_fraction: float) -> bool:
    """The held-out rule: the first 8 bytes of the blake2b hash of the text, as a fraction of 2**64."""
    h = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(h, "little") < val_fraction * 2.0**64


def encode_batch(batch: tuple[list, float | None, str]) -> tuple[np.ndarray, np.ndarray, int, int, int]:
    """(train ids, val ids, train docs, val docs, text bytes) of a batch of (split or None, text)."""
    docs, val_fraction, dtype = batch
    tok = _TOKENIZER
    eot = np.array([tok.eot_id], dtype=np.int64)
    parts: dict[str, list[np.ndarray]] = {"train": [], "val": []}
    n_bytes = 0
    for split, text in docs:
        split = split or ("val" if is_val(text, val_fraction) else "train")
        parts[split] += [eot, tok.encode_array(text)]
        n_bytes += len(text.encode("utf-8", "surrogatepass"))
    out = [np.concatenate(p).astype(dtype) if p else np.empty(0, dtype) for p in parts.values()]
    return out[0], out[1], len(parts["train"]) // 2, len(parts["val"]) // 2, n_bytes


def _ordered_map(fn: Callable, items: Iterator, workers: int, spec: tuple) -> Iterator:
    """``fn`` over ``items`` in ``workers`` processes, results in order, at most 2 x workers batches in
    flight (Pool.imap would read the whole input ahead). One worker: in this process."""
    if workers == 1:
        _init_worker(spec)
        yield from map(fn, items)
        return
    # spawn: the caller may be a training process with threads (torch) that fork would copy mid-state
    with multiprocessing.get_context("spawn").Pool(workers, _init_worker, (spec,)) as pool:
        pending: deque = deque()
        for item in items:
            pending.append(pool.apply_async(fn, (item,)))
            if len(pending) >= 2 * workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


def _batches(cfg: Any, skip: int, dtype: str) -> Iterator[tuple]:
    """The corpus' documents after the first ``skip`` (done before an interruption), in batches."""
    val_fraction = float(cfg_value(cfg, "val_fraction"))
    batch: list = []
    size = 0
    n = 0
    for split, docs in documents.sources(cfg):
        for text in docs:
            n += 1
            if n <= skip:
                continue
            batch.append((split, text))
            size += len(text)
            if size >= BATCH_CHARS:
                yield batch, val_fraction, dtype
                batch, size = [], 0
    if batch:
        yield batch, val_fraction, dtype


# ----------------------------------------------------------------------------- the shards of a split


class _Split:
    """The shards of one split: finished ones (records) and the one being written."""

    def __init__(self, entry: Path, prefix: str, split: str, dtype, shard_tokens: int, state: dict):
        self.entry, self.dtype, self.shard_tokens = entry, dtype, shard_tokens
        self.name = f"{prefix}_{split}_{{:06d}}.bin"
        self.records: list[dict] = list(state.get("shards", []))
        partial = int(state.get("partial", 0))
        self._drop_unrecorded(partial)
        self.writer = ShardWriter(self._path(), dtype, partial) if partial else None

    def _path(self) -> Path:
        return self.entry / self.name.format(len(self.records))

    def _drop_unrecorded(self, partial: int) -> None:
        """After an interruption: shards finished after the last checkpoint are undone (the one being
        written goes back to its temp file, truncated there; later ones are removed)."""
        k = len(self.records)
        current, tmp = self._path(), self._path().with_name(f".{self._path().name}.partial")
        if partial and current.exists() and not tmp.exists():
            os.replace(current, tmp)
        while (later := self.entry / self.name.format(k + (0 if not partial else 1))).exists():
            later.unlink()
            k += 1

    def write(self, ids: np.ndarray) -> bool:
        """Append ``ids``; True when a shard was finished."""
        finished = False
        while len(ids):
            if self.writer is None:
                self.writer = ShardWriter(self._path(), self.dtype)
            room = self.shard_tokens - self.writer.n
            self.writer.write(ids[:room])
            ids = ids[room:]
            if self.writer.n == self.shard_tokens:
                self._close()
                finished = True
        return finished

    def _close(self) -> None:
        path, n = self._path(), self.writer.n
        self.records.append({"file": path.name, "tokens": n, "sha256": self.writer.close()})
        self.writer = None

    def state(self) -> dict:
        return {"shards": self.records, "partial": self.writer.sync() if self.writer else 0}

    def finish(self) -> None:
        if self.writer is not None and self.writer.n:
            self._close()


# ----------------------------------------------------------------------------- the whole prepare


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _tokenizer_spec(cfg: Any, entry: Path, log: Callable[[str], Any]) -> tuple:
    """What a worker builds its tokenizer from; a BPE is trained first on the training documents."""
    name = cfg_value(cfg, "tokenizer")
    vocab = cfg_value(cfg, "vocab_size") or (DEFAULT_BPE_VOCAB if name == "bpe" else None)
    if name == "bpe" and not (entry / "tokenizer.json").exists():
        log(f"training a {vocab}-token BPE on the training documents of {entry.name} ...")
        val_fraction = float(cfg_value(cfg, "val_fraction"))
        train_docs = (
            text
            for split, docs in documents.sources(cfg)
            for text in docs
            if split == "train" or (split is None and not is_val(text, val_fraction))
        )
        build_tokenizer("bpe", vocab, train_docs, entry, eot=True)
    return name, vocab, str(entry)


def _tokenize_all(cfg: Any, entry: Path, spec: tuple, state: dict, log: Callable[[str], Any]) -> dict:
    """The pass over the corpus, resuming from ``state`` (progress.json) and checkpointing it."""
    tok = build_tokenizer(spec[0], spec[1], None, entry, eot=True)
    if tok.eot_id is None:
        raise DataError(f"data.tokenizer={spec[0]} has no end-of-text token to put between documents")
    dtype = token_dtype(tok.vocab_size)
    prefix, shard_tokens = shard_prefix(cfg), int(cfg_value(cfg, "shard_tokens"))
    splits = {s: _Split(entry, prefix, s, dtype, shard_tokens, state.get(s, {})) for s in ("train", "val")}
    counts = state.get("counts", {"documents": {"train": 0, "val": 0}, "bytes": 0})
    workers = int(cfg_value(cfg, "workers") or usable_cores())
    if state:
        log(
            f"resuming the prepare of {entry.name} after {counts['documents']['train'] + counts['documents']['val']} "
            "documents (finished shards kept)"
        )
    items = _batches(cfg, state.get("docs_done", 0), dtype.str)
    _consume(_ordered_map(encode_batch, items, workers, spec), splits, counts, entry, cfg, log)
    for s in splits.values():
        s.finish()
    return {"tokenizer": tok, "splits": splits, "counts": counts, "dtype": dtype}


def _consume(results: Iterator, splits: dict, counts: dict, entry: Path, cfg: Any, log) -> None:
    """Write each batch's ids to its split's shards, count, show progress and checkpoint."""
    progress, last = None, time.time()
    try:
        for train_ids, val_ids, n_train, n_val, n_bytes in results:
            if progress is None:  # first result: a source that fails at once leaves no bar behind
                progress = Progress(f"prepare {entry.name}", documents.known_size(cfg), log)
            finished = splits["train"].write(train_ids) | splits["val"].write(val_ids)
            counts["documents"]["train"] += n_train
            counts["documents"]["val"] += n_val
            counts["bytes"] += n_bytes
            written = sum(
                sum(r["tokens"] for r in s.records) + (s.writer.n if s.writer else 0) for s in splits.values()
            )
            progress.update(n_bytes, n_train + n_val, written)
            if finished or time.time() - last > CHECKPOINT_S:
                _checkpoint(entry, splits, counts)
                last = time.time()
    finally:
        if progress is not None:
            progress.close()


def _checkpoint(entry: Path, splits: dict, counts: dict) -> None:
    done = counts["documents"]["train"] + counts["documents"]["val"]
    state = {s: split.state() for s, split in splits.items()}
    _write_json(entry / "progress.json", {**state, "counts": counts, "docs_done": done})


def _manifest(cfg: Any, key: dict, result: dict, seconds: float) -> dict:
    counts, tok = result["counts"], result["tokenizer"]
    shards = {s: split.records for s, split in result["splits"].items()}
    tokens = {s: sum(r["tokens"] for r in recs) for s, recs in shards.items()}
    n = counts["documents"]["train"] + counts["documents"]["val"]
    if not n:
        where = (
            f"data.paths={list(cfg_value(cfg, 'paths'))}"
            if cfg_value(cfg, "name") == "files"
            else f"data.hf_path={cfg_value(cfg, 'hf_path')!r} (split {cfg_value(cfg, 'hf_split')!r})"
        )
        raise DataError(f"{where}: the corpus holds no documents (empty files, or rows without text); give others")
    for split in ("train", "val"):
        if not counts["documents"][split]:
            raise DataError(
                f"data: none of the corpus' {n} documents went to {split} (whole documents are held out, "
                f"a .txt file being one): give a validation set (data.val_paths / data.hf_val_split), "
                "more documents or another data.val_fraction"
            )
    return {
        "format": PREPARE_FORMAT,
        "key": key,
        "tokenizer": tok.name,
        "vocab_size": tok.vocab_size,
        "eot_id": tok.eot_id,
        "dtype": result["dtype"].name,
        "documents": counts["documents"],
        "tokens": tokens,
        "bytes": counts["bytes"],
        "shards": shards,
        "seconds": round(seconds, 1),
    }


def prepare(cfg: Any, log: Callable[[str], Any] = print) -> tuple[Path, dict]:
    """The prepared entry of ``cfg``'s corpus and its manifest, preparing (or finishing) it first when
    needed. Under torchrun, ranks other than local rank 0 wait for local rank 0's manifest."""
    entry, key = entry_path(cfg)
    manifest = read_manifest(entry)
    if manifest is not None:
        return entry, manifest
    if int(os.environ.get("WORLD_SIZE", 1)) > 1 and int(os.environ.get("LOCAL_RANK", 0)) != 0:
        log(f"rank {os.environ.get('RANK')} waits while local rank 0 prepares {entry.name}")
        while (manifest := read_manifest(entry)) is None:
            time.sleep(1.0)
        return entry, manifest
    try:
        entry.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"data.cache_dir: cannot write the shards at {entry} ({e.strerror or e})") from None
    with entry_lock(entry.parent, entry, log):
        manifest = read_manifest(entry)
        if manifest is None:  # not finished by the process we waited for
            t0 = time.time()
            try:
                state = json.loads((entry / "progress.json").read_text())
            except (OSError, ValueError):
                state = {}
            spec = _tokenizer_spec(cfg, entry, log)
            result = _tokenize_all(cfg, entry, spec, state, log)
            manifest = _manifest(cfg, key, result, time.time() - t0)
            _write_json(entry / "manifest.json", manifest)  # last: it marks the entry complete
            (entry / "progress.json").unlink(missing_ok=True)
    return entry, manifest
