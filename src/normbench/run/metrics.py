"""Where metrics go: ``metrics.jsonl`` always (flushed per record), W&B when asked.

One JSON object per line; a reader must tolerate a truncated last line (a
crash mid-write), see :func:`read_jsonl`. On resume, records past the
checkpoint's step are dropped so that every step appears once.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else (1e308 if value > 0 else -1e308)
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def read_jsonl(path: Path) -> list[dict]:
    """All complete records; a torn or corrupt line (crash mid-write) is skipped."""
    records = []
    path = Path(path)
    if not path.exists():
        return records
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if isinstance(rec, dict):
                records.append(rec)
    return records


class JsonlWriter:
    """Appends records to ``path``; with ``resume_step``, first keeps only the records up to that step
    (``kept``: those records, for a reader that goes on from them)."""

    def __init__(self, path: Path, resume_step: int | None = None):
        self.path = Path(path)
        self.kept: list[dict] = []
        if resume_step is not None:
            self.truncate_after(resume_step)
        elif self.path.exists() and self.path.stat().st_size:
            with open(self.path, "rb") as f:  # never glue a new record onto a torn last line
                f.seek(-1, os.SEEK_END)
                torn = f.read(1) != b"\n"
            if torn:
                with open(self.path, "a", encoding="utf-8") as f:
                    f.write("\n")
        self.f = open(self.path, "a", encoding="utf-8")

    def truncate_after(self, step: int) -> None:
        """Keep records with step <= ``step`` (those the checkpoint covers), drop torn lines."""
        self.kept = [r for r in read_jsonl(self.path) if type(r.get("step")) is int and r["step"] <= step]
        write_text_atomic("".join(json.dumps(r) + "\n" for r in self.kept), self.path)

    def amend(self, step: int, fields: dict) -> None:
        """Add ``fields`` to the record of ``step`` (a resumed run finishing an evaluation a signal cut short)."""
        self.f.close()
        records = [{**r, **fields} if r.get("step") == step else r for r in read_jsonl(self.path)]
        write_text_atomic("".join(json.dumps({k: _clean(v) for k, v in r.items()}) + "\n" for r in records), self.path)
        self.f = open(self.path, "a", encoding="utf-8")

    def write(self, record: dict) -> None:
        self.f.write(json.dumps({k: _clean(v) for k, v in record.items()}) + "\n")
        self.f.flush()

    def close(self) -> None:
        self.f.close()


def write_atomic(path: Path, write, binary: bool = False) -> None:
    """``write(file)`` into a temp file, fsync, rename over ``path``: ``path`` is always the old
    or the new complete file; the temp file goes if anything fails (checkpoints use this too)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    try:
        with open(tmp, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8"})) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(text: str, path: Path) -> None:
    write_atomic(path, lambda f: f.write(text))


def write_json_atomic(obj: dict, path: Path) -> None:
    write_text_atomic(json.dumps({k: _clean(v) for k, v in obj.items()}, indent=2) + "\n", path)
