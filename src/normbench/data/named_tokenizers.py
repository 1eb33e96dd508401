"""Tokenizers named in the config: ``tiktoken:NAME`` (a tiktoken encoding, e.g. ``cl100k_base``, the
one Peri-LN trained with) and ``hf:NAME_OR_PATH`` (a Hugging Face tokenizer through
``transformers.AutoTokenizer``, e.g. the LLaMA tokenizer of Mix-LN and HybridNorm).

Both work on an air-gapped node from a local copy: tiktoken reads its encoding files from
``$TIKTOKEN_CACHE_DIR`` (copy that folder from a machine where ``tiktoken.get_encoding(NAME)`` ran once),
and ``hf:`` takes a local directory (``AutoTokenizer.save_pretrained``'s) or a hub name already in the
HF cache with ``HF_HUB_OFFLINE=1``. A document's text is encoded as ordinary text (a literal
``<|endoftext|>`` in it is text, not the special token); ``eot_id`` is tiktoken's ``eot_token`` and the
HF tokenizer's ``eos_token_id``.
"""

from __future__ import annotations

import functools
import os

import numpy as np

from normbench.errors import DataError


class TiktokenEncoded:
    """A tokenizer that is a ``tiktoken.Encoding`` (``self._enc``): GPT-2's and any named one
    (data/named_tokenizers.py). User text is encoded as ordinary text: a literal "<|endoftext|>" in a corpus is
    text, not an error."""

    _enc = None

    def encode(self, text: str) -> list[int]:
        return self._enc.encode_ordinary(text)

    def encode_array(self, text: str) -> np.ndarray:
        return np.asarray(self.encode(text), dtype=np.int64)

    def decode(self, ids) -> str:
        return self._enc.decode([int(i) for i in ids])


class TiktokenTokenizer(TiktokenEncoded):
    def __init__(self, encoding_name: str):
        import tiktoken  # start-up cost: only for this tokenizer

        try:
            self._enc = tiktoken.get_encoding(encoding_name)
        except ValueError as e:  # an unknown name
            raise DataError(f"data.tokenizer=tiktoken:{encoding_name}: {e}") from None
        except Exception as e:  # a download that failed (offline): many types
            raise DataError(
                f"data.tokenizer=tiktoken:{encoding_name} cannot be loaded ({type(e).__name__}); offline, set "
                "TIKTOKEN_CACHE_DIR to a folder where tiktoken.get_encoding ran once with the network"
            ) from None
        self.name = f"tiktoken:{encoding_name}"
        self.vocab_size = self._enc.n_vocab
        self.eot_id = self._enc.eot_token


class HfTokenizer:
    def __init__(self, name_or_path: str):
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the worker processes are the parallelism
        try:
            from transformers import AutoTokenizer  # start-up cost: only for this tokenizer

            self._tok = AutoTokenizer.from_pretrained(os.path.expanduser(name_or_path))
        except ImportError:
            raise DataError("data.tokenizer=hf:... needs the package `transformers`") from None
        except Exception as e:  # hub/file errors of many types
            raise DataError(
                f"data.tokenizer=hf:{name_or_path} cannot be loaded ({type(e).__name__}: "
                f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}); give a local directory "
                "(AutoTokenizer.save_pretrained) or a hub name in the HF cache"
            ) from None
        self.name = f"hf:{name_or_path}"
        self.vocab_size = len(self._tok)
        self.eot_id = self._tok.eos_token_id

    def encode(self, text: str) -> list[int]:
        return self._tok(text, add_special_tokens=False)["input_ids"]

    def encode_array(self, text: str) -> np.ndarray:
        return np.asarray(self.encode(text), dtype=np.int64)

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids])


@functools.lru_cache(maxsize=4)
def named_tokenizer(spec: str):
    """``tiktoken:NAME`` or ``hf:NAME_OR_PATH`` (cached: loading one can take seconds)."""
    kind, _, name = spec.partition(":")
    if not name:
        raise DataError(f"data.tokenizer={spec!r} names no tokenizer; e.g. tiktoken:cl100k_base or hf:/path/to/dir")
    return TiktokenTokenizer(name) if kind == "tiktoken" else HfTokenizer(name)
