"""Tests of normbench.data (corpus, tokenizer): corpora, tokenizers, split, cache, errors (all offline)."""

from __future__ import annotations

import collections
import json
import math
import re

import numpy as np
import pytest
from omegaconf import OmegaConf

from normbench.config.schema import DataConfig
from normbench.data.corpus import TokenData, corpus_text, load_data, split_text
from normbench.data.tokenizer import build_tokenizer
from normbench.errors import DataError


def make_cfg(tmp_path, **kw):
    return OmegaConf.structured(DataConfig(cache_dir=str(tmp_path / "cache"), **kw))


def quiet(_msg):
    pass


@pytest.fixture(scope="module")
def kjv_text():
    return corpus_text(DataConfig())


def test_kjv_corpus(kjv_text):
    assert kjv_text.startswith("In the beginning God created the heavens and the earth.\n")
    assert kjv_text.rstrip().endswith("The grace of our Lord Jesus Christ be with you all. Amen.")
    assert re.search(r"\d+:\d+", kjv_text) is None
    assert re.search(r"\d", kjv_text) is None  # no range leftovers such as "-15"
    assert "  " not in kjv_text and "\n " not in kjv_text
    assert 4.0e6 < len(kjv_text) < 4.3e6
    lines = kjv_text.splitlines()
    assert 31_000 < len(lines) < 31_200  # the KJV has 31,102 verses
    # A verse from a multi-verse row (Gen 1:14-15) is split into its own line.
    assert (
        "And let them be for lights in the firmament of the heaven to give light upon the earth: and it was so."
        in lines
    )


def test_byte_round_trip(tmp_path):
    tok = build_tokenizer("byte", None, None, tmp_path)
    text = "Héllo, wörld — ✓\n"
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8")) and tok.vocab_size == 256
    assert tok.decode(ids) == text
    assert tok.encode_array(text).tolist() == ids


def test_gpt2_known_ids(tmp_path):
    tok = build_tokenizer("gpt2", None, None, tmp_path)
    assert tok.vocab_size == 50257 and tok._enc.n_vocab == 50257
    assert tok.encode("Hello world") == [15496, 995]
    assert tok.encode(" the") == [262]
    text = "In the beginning God created the heavens and the earth.\n"
    assert tok.decode(tok.encode(text)) == text
    assert tok.encode("<|endoftext|>") != [50256]  # user text never becomes the special token


def test_split_at_line_boundary():
    text = "".join(f"line {i}\n" for i in range(100))
    train, val = split_text(text, 0.1)
    assert train + val == text
    assert train.endswith("\n") and val.startswith("line ")
    assert 0.05 < len(val) / len(text) < 0.15


def test_split_of_few_long_lines_keeps_the_val_share():
    """A line start far from the target would make val several times too large: cut mid-line instead."""
    train, val = split_text("x" * 60 + "\n" + "y" * 300 + "\n", 0.1)  # the only line start: 61 of 362
    assert len(val) == 362 - int(362 * 0.9) and set(val) == {"y", "\n"}
    text = "".join(("word " * 20_000)[:-1] + "\n" for _ in range(3))  # three 100 kB lines
    train, val = split_text(text, 0.1)
    assert train + val == text and 0.05 < len(val) / len(text) < 0.15 and val.startswith("word")
    text = "a\n" * 50 + "b" * 20 + "\n"  # nearest line start is after the target, not before
    train, val = split_text(text, 0.3)
    assert train + val == text and abs(len(val) - 0.3 * len(text)) <= 0.5 * 0.3 * len(text) + 1


def test_byte_cache_reuse(tmp_path):
    cfg = make_cfg(tmp_path, name="synthetic", synthetic_tokens=20_000)
    logs = []
    first = load_data(cfg, log=logs.append)
    assert isinstance(first, TokenData) and not first.from_cache
    assert logs[0].startswith("tokenizing synthetic with byte") and logs[-1].startswith("cached 20.")
    assert first.train.dtype == np.uint16 and first.train.ndim == 1 and isinstance(first.train, np.memmap)
    assert first.vocab_size == 256 and first.n_chars >= 20_000
    assert len(first.train) + len(first.val) == first.n_chars  # ASCII text: one byte per char
    assert 0.03 < len(first.val) / first.n_chars < 0.07
    assert first.tokenizer.decode(first.train[:5]) == corpus_text(cfg)[:5]
    assert (first.cache_path / "meta.json").exists()
    with pytest.raises(ValueError):
        first.train[0] = 1  # opened read-only
    second = load_data(cfg, log=quiet)
    assert second.from_cache and second.cache_path == first.cache_path
    assert np.array_equal(second.train, first.train) and np.array_equal(second.val, first.val)
    assert second.n_chars == first.n_chars
    # Another val_fraction is another cache entry.
    third = load_data(make_cfg(tmp_path, name="synthetic", synthetic_tokens=20_000, val_fraction=0.1), log=quiet)
    assert not third.from_cache and third.cache_path != first.cache_path
    assert not list((tmp_path / "cache").glob(".tmp-*"))  # temp dirs are cleaned up


def test_bpe_trains_round_trips_and_is_cached(tmp_path, kjv_text):
    """A BPE trained on a corpus of documents reserves <|endoftext|> inside its vocabulary size."""
    verses = kjv_text[:400_000].splitlines(keepends=True)
    path = tmp_path / "corpus.jsonl"
    path.write_text(
        "".join(json.dumps({"text": "".join(verses[i : i + 50])}) + "\n" for i in range(0, len(verses), 50))
    )
    cfg = make_cfg(tmp_path, name="files", paths=[str(path)], tokenizer="bpe", vocab_size=512, workers=1)
    data = load_data(cfg, log=quiet)
    tok = data.tokenizer
    assert data.vocab_size == 512 and tok.vocab_size == 512 and tok.learned_size == 512
    assert tok.eot_id == 0 and tok.decode([tok.eot_id]) == ""  # the trainer's one special token, id 0
    assert (data.cache_path / "tokenizer.json").exists()
    assert int(data.train.max()) < 512 and len(data.train) < 0.5 * 400_000  # it does merge
    assert data.val[0] == tok.eot_id
    unseen = "Zebra quartz! ✓ 42\n"
    assert tok.decode(tok.encode(unseen)) == unseen
    again = load_data(cfg, log=quiet)
    assert again.cache_path == data.cache_path and np.array_equal(again.train, data.train)
    assert again.tokenizer.encode(unseen) == tok.encode(unseen)


def test_files_corpus(tmp_path):
    """Each .txt file is one document, its text as given; byte ids with 256 before each document."""
    texts = [f"file {i} line one\r\nline two {'é' * i}" for i in range(40)]  # no trailing newline, CRLF kept
    for i, text in enumerate(texts):
        (tmp_path / f"{i:02d}.txt").write_bytes(text.encode())
    cfg = make_cfg(tmp_path, name="files", paths=[str(tmp_path / "*.txt")], workers=1)
    data = load_data(cfg, log=quiet)
    assert data.vocab_size == 257 and data.tokenizer.eot_id == 256
    docs = []
    for split in (data.train, data.val):
        ids = np.asarray(split)
        starts = np.flatnonzero(ids == 256)
        assert starts[0] == 0
        docs += [bytes(ids[a + 1 : b].astype(np.uint8)).decode() for a, b in zip(starts, [*starts[1:], len(ids)])]
    assert sorted(docs) == sorted(texts) and len(data.val) > 0
    # A changed file is a new cache entry, not stale tokens.
    (tmp_path / "00.txt").write_text("changed content\n")
    fresh = load_data(cfg, log=quiet)
    assert fresh.cache_path != data.cache_path


def test_files_relative_and_home_paths(tmp_path, monkeypatch):
    from normbench.data.pipeline.documents import expand_paths

    (tmp_path / "rel.txt").write_text("relative path text\n" * 10)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    for given in ("rel.txt", "~/rel.txt"):
        assert expand_paths([given]) == [tmp_path / "rel.txt"]


def _load_in_child(cfg_dict, queue):
    data = load_data(OmegaConf.create(cfg_dict), log=quiet)
    queue.put((str(data.cache_path), int(np.asarray(data.train, dtype=np.int64).sum()), len(data.val)))


def test_parallel_builds_share_one_entry(tmp_path):
    """Jobs that start on an empty cache at once each build a copy; one rename wins and all read it."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    cfg = OmegaConf.to_container(make_cfg(tmp_path, name="synthetic", synthetic_tokens=200_000))
    queue = ctx.Queue()
    procs = [ctx.Process(target=_load_in_child, args=(cfg, queue)) for _ in range(3)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert len(set(results)) == 1
    entries = [e for e in (tmp_path / "cache").iterdir() if not e.name.endswith(".lock")]  # the entry's flock file
    assert [e.name for e in entries] == [results[0][0].rsplit("/", 1)[-1]]  # no temp dirs left behind
    assert load_data(OmegaConf.create(cfg), log=quiet).from_cache


def test_bad_names_are_one_line_errors(tmp_path):
    with pytest.raises(DataError, match=r"^data.tokenizer='sentencepiece' is not allowed"):
        load_data(make_cfg(tmp_path, tokenizer="sentencepiece"), log=quiet)
    with pytest.raises(DataError, match=r"^data.name='wiki' is not allowed"):
        load_data(make_cfg(tmp_path, name="wiki"), log=quiet)
    with pytest.raises(DataError, match=r"^data.paths is empty"):
        load_data(make_cfg(tmp_path, name="files"), log=quiet)


@pytest.mark.parametrize("kind", ["missing", "empty", "binary", "directory"])
def test_file_errors(tmp_path, kind):
    path = tmp_path / "x.txt"
    if kind == "empty":
        path.write_text("")
    elif kind == "binary":
        path.write_bytes(b"valid start\n\xff\xfe rest")
    elif kind == "directory":
        path.mkdir()
    cfg = make_cfg(tmp_path, name="files", paths=[str(path)], workers=1)
    with pytest.raises(DataError) as err:
        load_data(cfg, log=quiet)
    msg = str(err.value)
    assert msg.startswith("data") and "\n" not in msg
    expected = {
        "missing": "x.txt' not found",
        "empty": "the corpus holds no documents",
        "binary": "x.txt is not UTF-8 text (byte 0xff at offset 12)",
        "directory": "x.txt' matches no data file",
    }
    assert expected[kind] in msg


@pytest.fixture
def hf_offline(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    # Both libraries read the variables at import time, which may have happened in an earlier test.
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")
    return datasets


def _documents(data) -> list[str]:
    """The documents of a byte-tokenized corpus of documents, train then val."""
    docs = []
    for split in (data.train, data.val):
        ids = np.asarray(split)
        starts = np.flatnonzero(ids == 256)
        docs += [bytes(ids[a + 1 : b].astype(np.uint8)).decode() for a, b in zip(starts, [*starts[1:], len(ids)])]
    return docs


def test_hf_local_folder(tmp_path, hf_offline):
    folder = tmp_path / "ds"
    folder.mkdir()
    lines = [f"row number {i} of the local dataset" for i in range(200)]
    (folder / "train.txt").write_text("\n".join(lines) + "\n")
    cfg = make_cfg(tmp_path, name="hf", hf_path=str(folder), workers=1)
    data = load_data(cfg, log=quiet)  # datasets' text builder: a line is a row, so a document
    assert sorted(_documents(data)) == sorted(lines)
    assert load_data(cfg, log=quiet).cache_path == data.cache_path
    bad_field = make_cfg(tmp_path, name="hf", hf_path=str(folder), hf_text_field="content")
    with pytest.raises(DataError, match=r"^data.hf_text_field='content' is not a column .*\['text'\]$"):
        load_data(bad_field, log=quiet)
    with pytest.raises(DataError, match=r"^data.hf_split='nope'"):
        load_data(make_cfg(tmp_path, name="hf", hf_path=str(folder), hf_split="nope"), log=quiet)


def test_hf_save_to_disk(tmp_path, hf_offline):
    rows = [f"alpha beta {i}" for i in range(60)]
    dd = hf_offline.DatasetDict(
        {
            "train": hf_offline.Dataset.from_dict({"body": rows, "n": list(range(60))}),
            "test": hf_offline.Dataset.from_dict({"body": ["held out"], "n": [3]}),
        }
    )
    dd.save_to_disk(str(tmp_path / "saved"))
    cfg = make_cfg(tmp_path, name="hf", hf_path=str(tmp_path / "saved"), hf_text_field="body", workers=1)
    cfg.hf_val_split = "test"  # a given validation split: all of it is val, all of train is train
    data = load_data(cfg, log=quiet)
    assert _documents(data) == rows + ["held out"]
    assert bytes(np.asarray(data.val)[1:].astype(np.uint8)) == b"held out"
    cfg.hf_text_field = "n"
    with pytest.raises(DataError, match="holds int"):
        load_data(cfg, log=quiet)


def test_hf_single_file(tmp_path, hf_offline):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(f'{{"text": "json row {i}", "id": {i}}}\n' for i in range(30)))
    cfg = make_cfg(tmp_path, name="hf", hf_path=str(path), workers=1, val_fraction=0.3)
    assert sorted(_documents(load_data(cfg, log=quiet))) == sorted(f"json row {i}" for i in range(30))
    odd = tmp_path / "rows.xyz"
    odd.write_text("x")
    with pytest.raises(DataError, match=r"^data.hf_path=.*a single file must be"):
        load_data(make_cfg(tmp_path, name="hf", hf_path=str(odd)), log=quiet)


def test_hf_hub_name_offline(tmp_path, hf_offline):
    cfg = make_cfg(tmp_path, name="hf", hf_path="foo/bar")
    with pytest.raises(DataError) as err:
        load_data(cfg, log=quiet)
    msg = str(err.value)
    assert msg == (
        "data.hf_path='foo/bar' could not be loaded offline: it needs the network "
        "(unset HF_DATASETS_OFFLINE / HF_HUB_OFFLINE) or a local path"
    )
    assert err.value.__cause__ is None and err.value.__suppress_context__


def _cross_entropy_bits(train: str, val: str, order: int) -> float:
    """Held-out bits/char of an add-0.01 smoothed character n-gram model (order 0 = unigram)."""
    ctx, full = collections.Counter(), collections.Counter()
    for i in range(order, len(train)):
        ctx[train[i - order : i]] += 1
        full[train[i - order : i + 1]] += 1
    v = len(set(train))
    total = sum(
        -math.log2((full[val[i - order : i + 1]] + 0.01) / (ctx[val[i - order : i]] + 0.01 * v))
        for i in range(order, len(val))
    )
    return total / (len(val) - order)


def test_synthetic_deterministic_and_learnable(tmp_path):
    cfg = make_cfg(tmp_path, name="synthetic", synthetic_tokens=60_000)
    text = corpus_text(cfg)
    assert text == corpus_text(cfg)
    assert 60_000 <= len(text) < 60_200 and text.endswith((".\n", "?\n"))
    words = text.split()
    assert len(set(words)) > 100  # not a trivial repetition
    train, val = split_text(text, 0.1)
    unigram = _cross_entropy_bits(train, val, 0)
    fourgram = _cross_entropy_bits(train, val, 4)
    assert unigram > 3.5  # many distinct characters in use
    assert fourgram < 0.5 * unigram  # context predicts the next character well: learnable structure
    assert (
        corpus_text(make_cfg(tmp_path, name="synthetic", synthetic_tokens=5_000)) == text[: text.index("\n", 4_999) + 1]
    )
