"""The documents of a corpus, one at a time, in a fixed order: what data/pipeline/prepare.py tokenizes.

- ``data=files``: ``data.paths`` are files, directories (every data file below, sorted) and globs
  (``**`` included), taken in the order given (each glob or directory sorted). A ``.txt`` / ``.md``
  file is one document; each row of a ``.jsonl`` / ``.json`` / ``.parquet`` / ``.csv`` file is one,
  its text in the column ``data.hf_text_field``. Compressed forms (``.gz``, ``.bz2``, ``.xz``,
  ``.zst``) are read as ``datasets`` and fsspec read them. ``data.val_paths`` (same forms), when
  given, is the validation set.
- ``data=hf``: a Hugging Face dataset by hub name or local path (``datasets.load_dataset``, streamed
  with ``data.hf_streaming=true``, else downloaded once to the HF cache), or a ``save_to_disk``
  folder; ``data.hf_val_split``, when given, is the validation set.

Rows are read with ``datasets`` (streaming, so memory stays flat), text files with fsspec. A
document's text goes in as given: no stripping, no normalising. Bad input is one line naming the
file and the fix (:class:`~normbench.errors.DataError`).
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from normbench.data.texts import abs_path, cfg_value, first_line, hf_error, hf_local_path
from normbench.errors import DataError

TEXT_SUFFIXES = (".txt", ".md", ".text")
ROW_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
COMPRESSION = (".gz", ".bz2", ".xz", ".zst", ".lz4")


def _kind(path: Path) -> str | None:
    """``text``, a datasets builder name, or None for a file that is not data."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in COMPRESSION:
        suffixes = suffixes[:-1]
    last = suffixes[-1] if suffixes else ""
    return "text" if last in TEXT_SUFFIXES else ROW_BUILDERS.get(last)


def expand_paths(given: list[str], key: str = "data.paths") -> list[Path]:
    """Every data file that ``given`` names, in order; a name that matches nothing is one line."""
    if not given:
        raise DataError(f"{key} is empty; data=files needs {key}=[a.jsonl,dir/,'shards/*.parquet',...]")
    out: list[Path] = []
    for item in given:
        path = abs_path(item)
        if glob.has_magic(str(item)):
            found = sorted(Path(p) for p in glob.glob(str(path), recursive=True) if Path(p).is_file())
        elif path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and _kind(p) and not p.name.startswith("."))
        elif path.exists():
            found = [path]
        else:
            raise DataError(f"{key}: file {item!r} not found (looked at {path})")
        found = [p for p in found if _kind(p)] if len(found) > 1 or path.is_dir() else found
        if not found:
            raise DataError(
                f"{key}: {item!r} matches no data file (.txt/.md, .jsonl/.json, .parquet, .csv, maybe compressed)"
            )
        if len(found) == 1 and _kind(found[0]) is None:
            raise DataError(f"{key}: {item!r} is not a data file; use .txt/.md, .jsonl/.json, .parquet or .csv")
        out += found
    return out


def files_identity(paths: list[Path]) -> list:
    return [[str(p), p.stat().st_size, p.stat().st_mtime_ns] for p in paths]


def _text_document(path: Path) -> str:
    import fsspec  # a dependency of datasets; only for reading text files

    try:
        with fsspec.open(str(path), "rb", compression="infer") as f:
            raw = f.read()
    except (OSError, ValueError, EOFError) as e:
        raise DataError(f"data.paths: {path} cannot be read ({first_line(e)})") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(
            f"data.paths: {path} is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); convert it "
            "(iconv -t UTF-8)"
        ) from None


def _jsonl_rows(path: Path, field: str) -> Iterator[str]:
    """The text of each line of an uncompressed ``.jsonl``, read with the json module, as :func:`row_texts` gives it
    (a blank line, a row whose field is null or missing after the first: no document). Hand-written because the
    reader is the one process that feeds the tokenizing workers: datasets' streamed json reader took 5.2 CPU-s
    per 100 MB here against 0.6 s for this, which kept 2 workers at 1.45x the tokens/s of 1 on 2 cores
    (docs/performance.md §8)."""
    first = True
    with path.open("rb") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                raise DataError(f"data.paths: {path} line {n} is not JSON ({first_line(e)})") from None
            if not isinstance(row, dict):
                raise DataError(f"data.paths: {path} line {n} is not a JSON object (a row is one object a line)")
            if first and field not in row:
                raise DataError(
                    f"data.hf_text_field={field!r} is not a field of {path}; its fields: {sorted(row)} "
                    f"(set data.hf_text_field=...)"
                )
            first = False
            text = row.get(field)
            if text is None:
                continue
            if not isinstance(text, str):
                raise DataError(f"data.hf_text_field={field!r} of {path} holds {type(text).__name__}, not text")
            yield text


def row_texts(path: Path, field: str) -> Iterator[str]:
    """The text of each row of a row file, streamed by ``datasets`` (an uncompressed .jsonl: :func:`_jsonl_rows`)."""
    if path.suffix == ".jsonl":
        yield from _jsonl_rows(path, field)
        return
    import datasets  # start-up cost: only for row files

    builder = _kind(path)
    try:
        ds = datasets.load_dataset(builder, data_files=[str(path)], split="train", streaming=True)
        first = True
        for row in ds:
            if first and field not in row:
                raise DataError(
                    f"data.hf_text_field={field!r} is not a field of {path}; its fields: {sorted(row)} "
                    f"(set data.hf_text_field=...)"
                )
            first = False
            text = row[field]
            if text is None:
                continue
            if not isinstance(text, str):
                raise DataError(f"data.hf_text_field={field!r} of {path} holds {type(text).__name__}, not text")
            yield text
    except DataError:
        raise
    except Exception as e:  # datasets/pyarrow raise many types for a bad file
        raise DataError(f"data.paths: {path} cannot be read as {builder} ({first_line(e)})") from None


def file_documents(paths: list[Path], field: str) -> Iterator[str]:
    for path in paths:
        if _kind(path) == "text":
            text = _text_document(path)
            if text:  # an empty file is no document
                yield text
        else:
            yield from row_texts(path, field)


# ----------------------------------------------------------------------------- Hugging Face datasets


def hf_dataset(cfg: Any, split: str):
    """The split ``split`` of data.hf_path: a ``save_to_disk`` folder, or ``load_dataset`` (streamed with
    data.hf_streaming). datasets' own progress bars (downloads) stay as the user set them."""
    import datasets  # start-up cost: only for data=hf

    path, conf, streaming = cfg_value(cfg, "hf_path"), cfg_value(cfg, "hf_config"), bool(cfg_value(cfg, "hf_streaming"))
    local = hf_local_path(path)
    saved = local is not None and any(
        (local / f).exists() for f in ("dataset_info.json", "state.json", "dataset_dict.json")
    )
    try:
        if saved:
            ds = datasets.load_from_disk(str(local))
            if isinstance(ds, datasets.DatasetDict):
                if split not in ds:
                    raise DataError(f"data.hf_split={split!r} is not a split of {path!r}; splits: {list(ds)}")
                ds = ds[split]
            return ds
        if local is not None and local.is_file():
            builder = _kind(local)
            if builder in (None, "text"):
                raise DataError(f"data.hf_path={path!r}: a single file must be .jsonl/.json/.parquet/.csv")
            return datasets.load_dataset(builder, data_files={split: str(local)}, split=split, streaming=streaming)
        return datasets.load_dataset(str(local) if local else path, conf, split=split, streaming=streaming)
    except DataError:
        raise
    except Exception as e:  # datasets raises many types; each becomes one line
        raise hf_error(e, path, local, conf, split) from None


def hf_documents(ds, path: str, field: str) -> Iterator[str]:
    names = getattr(ds, "column_names", None)
    if names is not None and field not in names:
        raise DataError(f"data.hf_text_field={field!r} is not a column of {path!r}; columns: {names}")
    try:
        for row in ds:
            text = row[field]
            if text is None:
                continue
            if not isinstance(text, str):
                raise DataError(f"data.hf_text_field={field!r} holds {type(text).__name__}, not text")
            yield text
    except (DataError, KeyboardInterrupt):
        raise
    except KeyError:
        raise DataError(f"data.hf_text_field={field!r} is not a column of {path!r}") from None
    except Exception as e:  # a stream that breaks (network) is one line
        raise DataError(f"data.hf_path={path!r}: reading it failed ({first_line(e)}); run again to resume") from None


# ----------------------------------------------------------------------------- a corpus' sources


def sources(cfg: Any) -> list[tuple[str | None, Iterator[str]]]:
    """The corpus as (split, documents) streams in order: split None is "train or val by the hash
    rule", "val" a given validation set."""
    name, field = cfg_value(cfg, "name"), cfg_value(cfg, "hf_text_field")
    if name == "files":
        train = file_documents(expand_paths(cfg_value(cfg, "paths")), field)
        if not cfg_value(cfg, "val_paths"):
            return [(None, train)]
        return [
            ("train", train),
            ("val", file_documents(expand_paths(cfg_value(cfg, "val_paths"), "data.val_paths"), field)),
        ]
    path, val_split = cfg_value(cfg, "hf_path"), cfg_value(cfg, "hf_val_split")
    train = hf_documents(hf_dataset(cfg, cfg_value(cfg, "hf_split")), path, field)
    if not val_split:
        return [(None, train)]
    return [("train", train), ("val", hf_documents(hf_dataset(cfg, val_split), path, field))]


def identity(cfg: Any) -> dict:
    """What determines the documents, computed without reading them (so that a prepared corpus is
    found at once)."""
    name = cfg_value(cfg, "name")
    if name == "files":
        ident: dict = {"files": files_identity(expand_paths(cfg_value(cfg, "paths")))}
        if cfg_value(cfg, "val_paths"):
            ident["val_files"] = files_identity(expand_paths(cfg_value(cfg, "val_paths"), "data.val_paths"))
        return {**ident, "text_field": cfg_value(cfg, "hf_text_field")}
    ident = {k: cfg_value(cfg, k) for k in ("hf_path", "hf_config", "hf_split", "hf_val_split", "hf_text_field")}
    local = hf_local_path(ident["hf_path"]) if ident["hf_path"] else None
    if local is not None:  # a local dataset can change in place: key on its files too
        files = [local] if local.is_file() else sorted(p for p in local.rglob("*") if p.is_file())
        ident["files"] = files_identity(files[:10000])
    return ident


def known_size(cfg: Any) -> int | None:
    """Bytes of the local files (the progress bar's total; compressed files make it approximate)."""
    if cfg_value(cfg, "name") != "files":
        return None
    paths = expand_paths(cfg_value(cfg, "paths")) + (
        expand_paths(cfg_value(cfg, "val_paths"), "data.val_paths") if cfg_value(cfg, "val_paths") else []
    )
    return sum(os.path.getsize(p) for p in paths)
