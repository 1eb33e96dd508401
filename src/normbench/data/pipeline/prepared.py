"""Token shards opened for training: a prepared corpus (data/pipeline/prepare.py) or shards made elsewhere.

``open_prepared`` prepares the corpus first when its entry is missing or unfinished and checks the
shards against the manifest (each file's size and header; the sha256 is for whoever copies them).
``open_external`` reads ``data=shards data.train=GLOB data.val=GLOB``: llm.c's or modded-nanogpt's
shards as they are, or ours copied elsewhere; the config's tokenizer must be the one that made them
(checked against a manifest beside them, the shards' id width and the largest id of the first shard).
Both return the fields of :class:`normbench.data.corpus.TokenData`.
"""

from __future__ import annotations

import glob
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from normbench.data.cache import fmt
from normbench.data.pipeline.documents import known_size
from normbench.data.pipeline.prepare import entry_path, prepare, read_manifest
from normbench.data.pipeline.shards import concatenated, read_shard
from normbench.data.texts import abs_path, cfg_value
from normbench.data.tokenizer import DEFAULT_BPE_VOCAB, build_tokenizer, token_dtype
from normbench.errors import DataError


def open_prepared(cfg: Any, log: Callable[[str], Any]) -> tuple:
    entry, manifest = prepare(cfg, log)
    arrays = []
    for split in ("train", "val"):
        parts = []
        for rec in manifest["shards"][split]:
            shard = read_shard(entry / rec["file"])
            if len(shard) != rec["tokens"]:
                raise DataError(f"shard {entry / rec['file']} does not match {entry}/manifest.json; remove {entry}")
            parts.append(shard)
        arrays.append(concatenated(parts))
    name, vocab = cfg_value(cfg, "tokenizer"), manifest["vocab_size"]
    tokenizer = build_tokenizer(name, vocab, None, entry, eot=True)
    docs = manifest["documents"]
    log(
        f"prepared {cfg_value(cfg, 'name')} at {entry}: {docs['train']} + {docs['val']} documents, "
        f"{fmt(len(arrays[0]))} + {fmt(len(arrays[1]))} {name} tokens (train + val)"
    )
    return arrays[0], arrays[1], tokenizer.vocab_size, tokenizer, entry, True, int(manifest["bytes"])


def _glob(key: str, pattern: str) -> list[Path]:
    found = sorted(Path(p) for p in glob.glob(str(abs_path(pattern))))
    if not found:
        raise DataError(f"{key}={pattern!r} matches no file (looked at {abs_path(pattern)})")
    return found


def _check_tokenizer(files: list[Path], shards: list[np.ndarray], tokenizer) -> None:
    """The config's tokenizer must be the one that made the shards."""
    manifest = read_manifest(files[0].parent)
    made_with = manifest and manifest.get("tokenizer")
    if made_with and made_with != tokenizer.name:
        raise DataError(
            f"data.tokenizer={tokenizer.name} but the shards at {files[0].parent} were made with {made_with} "
            f"(manifest.json); set data.tokenizer={made_with}"
        )
    want = token_dtype(tokenizer.vocab_size)
    if shards[0].dtype.itemsize != want.itemsize:
        raise DataError(
            f"shard {files[0]} holds {shards[0].dtype.itemsize * 8}-bit ids but data.tokenizer={tokenizer.name} "
            f"({tokenizer.vocab_size} ids) needs {want.itemsize * 8}-bit ones: set the tokenizer that made them"
        )
    head = np.asarray(shards[0][: 1 << 20])
    if head.size and int(head.max()) >= tokenizer.vocab_size:
        raise DataError(
            f"shard {files[0]} holds id {int(head.max())}, beyond data.tokenizer={tokenizer.name}'s "
            f"{tokenizer.vocab_size} ids: set the tokenizer that made them"
        )


def open_external(cfg: Any, log: Callable[[str], Any]) -> tuple:
    name = cfg_value(cfg, "tokenizer")
    vocab = cfg_value(cfg, "vocab_size") or (DEFAULT_BPE_VOCAB if name == "bpe" else None)
    arrays, files_of = [], []
    for split in ("train", "val"):
        files = _glob(f"data.{split}", cfg_value(cfg, split))
        arrays.append([read_shard(f) for f in files])
        files_of.append(files)
    tokenizer = build_tokenizer(name, vocab, None, files_of[0][0].parent, eot=True)
    _check_tokenizer(files_of[0], arrays[0], tokenizer)
    train, val = concatenated(arrays[0]), concatenated(arrays[1])
    log(
        f"shards: {len(files_of[0])} train ({fmt(len(train))} tokens) and {len(files_of[1])} val "
        f"({fmt(len(val))} tokens) from {files_of[0][0].parent}"
    )
    return train, val, tokenizer.vocab_size, tokenizer, files_of[0][0].parent, True, 0


KJV_CHARS = 4_100_000  # data=kjv's text, about (docs/contract.md §6)


def train_tokens(cfg: Any) -> tuple[int | None, bool]:
    """(the training tokens of ``cfg``'s corpus, exact?) without tokenizing anything: a prepared corpus'
    manifest, the shards' headers, else an estimate from its characters (a byte per token for ``byte``,
    four for the others); None where nothing tells (a hub dataset not prepared yet)."""

    name, tok = cfg_value(cfg, "name"), cfg_value(cfg, "tokenizer")
    share = 1.0 - float(cfg_value(cfg, "val_fraction"))
    per_token = 1.0 if tok == "byte" else 4.0
    if name == "shards":
        files = [Path(p) for p in sorted(glob.glob(str(abs_path(cfg_value(cfg, "train") or ""))))]
        return (sum(len(read_shard(f)) for f in files) or None), True
    if name in ("files", "hf"):
        manifest = read_manifest(entry_path(cfg)[0])
        if manifest is not None:
            return int(manifest["tokens"]["train"]), True
        size = known_size(cfg)
        return (None if size is None else int(size * share / per_token)), False
    chars = KJV_CHARS if name == "kjv" else int(cfg_value(cfg, "synthetic_tokens"))
    return int(chars * share / per_token), False
