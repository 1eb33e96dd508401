"""The ``data.*`` keys' checks, shared by the config's validation and by :func:`~normbench.data.corpus.load_data`."""

from __future__ import annotations

from typing import Any

from normbench.config.schema import DATAS, TOKENIZERS, DataConfig
from normbench.data.tokenizer import fixed_vocab
from normbench.errors import DataError


def check_data(d: Any) -> None:
    """The ``data.*`` keys (DataError, one line). Part of :func:`validate`; data.load_data runs it too,
    for callers that hand it a data section alone. ``val_fraction`` is in (0, 0.5): the split is cut
    at a line boundary within 0.5x-1.5x of it (data.split_text), so the training part stays the larger."""
    get = lambda key: getattr(d, key, getattr(DataConfig, key, None))  # any object, defaults
    name, tokenizer, vocab_size = get("name"), get("tokenizer"), get("vocab_size")
    named = isinstance(tokenizer, str) and tokenizer.startswith(("tiktoken:", "hf:"))
    for key, value, allowed in (("data.name", name, DATAS), ("data.tokenizer", tokenizer, TOKENIZERS)):
        if value not in allowed and not (key == "data.tokenizer" and named):
            raise DataError(f"{key}={value!r} is not allowed; choose one of: {', '.join(allowed)}")
    val_fraction = get("val_fraction")
    if not 0.0 < val_fraction < 0.5:
        raise DataError(f"data.val_fraction={val_fraction} must be in (0, 0.5)")
    if vocab_size is not None:
        if vocab_size <= 0:
            raise DataError(f"data.vocab_size={vocab_size} must be > 0")
        fixed = fixed_vocab(tokenizer, name)
        if fixed is not None and vocab_size != fixed:
            raise DataError(f"data.vocab_size={vocab_size} does not fit data.tokenizer={tokenizer} ({fixed})")
        if tokenizer == "bpe" and vocab_size < 257:
            raise DataError(f"data.vocab_size={vocab_size} must be >= 257 for data.tokenizer=bpe")
    if name == "files" and not get("paths"):
        raise DataError("data.paths is empty; data=files needs data.paths=[file1.txt,...]")
    if name == "hf" and not get("hf_path"):
        raise DataError("data.hf_path is not set; data=hf needs data.hf_path=<hub name or local path>")
    if name == "synthetic" and get("synthetic_tokens") < 100:
        raise DataError(f"data.synthetic_tokens={get('synthetic_tokens')} must be >= 100")
    if name == "shards" and not (get("train") and get("val")):
        raise DataError("data=shards needs data.train=GLOB and data.val=GLOB (e.g. 'fineweb_train_*.bin')")
    if name == "mix" and not get("mix"):
        raise DataError("data=mix needs data.mix=[DIR:WEIGHT,...] (prepared directories, as prepare prints them)")
    workers = get("workers")
    if workers is not None and workers < 1:
        raise DataError(f"data.workers={workers} must be >= 1 (or null: the usable cores)")
    if get("shard_tokens") < 1024:
        raise DataError(f"data.shard_tokens={get('shard_tokens')} must be >= 1024")
