"""Where an export goes: OUT_DIR is checked, the files are written to a hidden staging directory, and
only an export that passed its check is published; a failed one leaves nothing behind.

- A new OUT_DIR: staged in a sibling made with ``os.mkdir`` (mode ``0o777`` less the umask, and the
  group and setgid bit of a setgid parent: what a plain ``mkdir`` gives, not ``mkdtemp``'s 0700), then
  renamed into place. Parents of OUT_DIR that did not exist are made the same way, and removed again
  when the export fails. Every file gets the mode a plain ``open()`` gives there (a writer's 0600
  widened to 0o666 less the umask).
- An existing empty OUT_DIR: staged in a hidden directory inside it, whose entries are moved up once
  the export passed its check. OUT_DIR itself is never replaced, so its owner, mode, group, setgid bit
  and ACLs stay as they were (and the files get its group where it is setgid). Should a move fail,
  the entries moved so far are taken out again: OUT_DIR is left empty, as it was found.
- Any ``OSError`` on the way (a read-only or missing parent, a full disk, a name that is a file), and
  the I/O errors of the Rust writers (safetensors, tokenizers: plain exceptions that end in
  ``(os error N)``), become one :class:`ConfigError` line naming the path.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import stat
from contextlib import contextmanager
from pathlib import Path

from normbench.errors import ConfigError

STAGE_PREFIX = ".normbench-export-"
_RUST_IO = re.compile(r"\(os error (\d+)\)")


def check_out_dir(out_dir: Path) -> None:
    """OUT_DIR must not exist, or be an empty directory; ConfigError (one line) otherwise."""
    if not out_dir.exists():
        if out_dir.is_symlink():
            raise ConfigError(f"OUT_DIR {out_dir} is a dangling symbolic link; choose a new directory or remove it")
        return
    if not out_dir.is_dir():
        raise ConfigError(f"OUT_DIR {out_dir} is a file, not a directory; choose a new one")
    try:
        entries = sorted(p.name for p in out_dir.iterdir())
    except OSError as exc:
        raise ConfigError(f"OUT_DIR {out_dir} cannot be read ({exc.strerror or exc})") from None
    if entries:
        stale = [e for e in entries if e.startswith(STAGE_PREFIX)]
        hint = f" (it holds {stale[0]}, left by an export that was killed: remove it)" if stale == entries else ""
        raise ConfigError(f"OUT_DIR {out_dir} exists and is not empty{hint}; choose a new directory or remove it")


def as_os_error(exc: BaseException) -> OSError | None:
    """``exc`` if it is an OSError; a Rust writer's I/O error (``... (os error 28)``) as one; else None."""
    if isinstance(exc, OSError):
        return exc
    found = _RUST_IO.search(str(exc))
    if found:
        errno = int(found.group(1))
        return OSError(errno, os.strerror(errno))
    return None


def _shown(path: str | os.PathLike | None, out_dir: Path) -> Path:
    """The path to name in an error: one in a staging directory as it would have been in OUT_DIR."""
    if path is None:
        return out_dir
    parts = Path(os.fsdecode(path)).parts
    for i, part in enumerate(parts):
        if part.startswith(STAGE_PREFIX):
            return out_dir.joinpath(*parts[i + 1 :])
    return Path(*parts)


def _error_line(exc: OSError, out_dir: Path) -> str:
    shown, why = _shown(exc.filename, out_dir), exc.strerror or type(exc).__name__
    if shown == out_dir:
        return f"export: cannot write {out_dir} ({why}); nothing was written"
    return f"export: cannot write {shown} ({why}); nothing was written to {out_dir}"


def _make_parents(directory: Path, made: list[Path]) -> None:
    """``mkdir -p directory``, noting in ``made`` each directory it made (outermost first)."""
    missing = []
    while not directory.exists() and not directory.is_symlink():
        missing.append(directory)
        directory = directory.parent
    for d in reversed(missing):
        d.mkdir()  # 0o777 less the umask, as mkdir(1)
        made.append(d)


def _mkdir_stage(where: Path) -> Path:
    """A new hidden directory in ``where``, made as ``mkdir`` makes one (umask, setgid parent)."""
    while True:
        stage = where / f"{STAGE_PREFIX}{secrets.token_hex(4)}"
        try:
            os.mkdir(stage, 0o777)
            return stage
        except FileExistsError:
            continue
        except OSError as exc:  # name the directory that refused, not the staging name
            raise OSError(exc.errno, exc.strerror, str(where)) from None


def _plain_file_modes(stage: Path) -> None:
    """Give every staged file the mode a plain ``open()`` gives there (0o666 less the umask, or what a default
    ACL says): some writers make theirs with ``mkstemp``'s 0600 (safetensors 0.8 does), which would keep
    the weights from the group of a group-shared directory."""
    probe = stage / ".mode-probe"
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
    finally:
        os.close(fd)
        probe.unlink()
    for path in stage.rglob("*"):
        if path.is_file() and not path.is_symlink() and stat.S_IMODE(path.stat().st_mode) != mode:
            path.chmod(mode)


def _move_up(stage: Path, out_dir: Path) -> None:
    """The staged entries into OUT_DIR (which holds nothing else); all of them, or none."""
    others = [p.name for p in out_dir.iterdir() if p != stage]
    if others:
        raise ConfigError(f"OUT_DIR {out_dir} was written to during the export ({others[0]}); nothing was written")
    moved = []
    try:
        for entry in sorted(stage.iterdir()):
            os.rename(entry, out_dir / entry.name)
            moved.append(out_dir / entry.name)
    except OSError:
        for path in moved:  # back out: OUT_DIR was empty and stays so
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        raise
    stage.rmdir()


@contextmanager
def staged(out_dir: Path):
    """Yield an empty staging directory for the export's files; when the block ends without an error,
    publish them as OUT_DIR. On any error nothing stays: not the staging directory, not a parent made
    here, and an existing empty OUT_DIR is left empty. OSErrors become one ConfigError line."""
    out_dir = Path(out_dir)
    check_out_dir(out_dir)
    inside = out_dir.is_dir()
    stage: Path | None = None
    made: list[Path] = []
    published = False
    try:
        _make_parents(out_dir.parent, made)
        stage = _mkdir_stage(out_dir if inside else out_dir.parent)
        yield stage
        _plain_file_modes(stage)
        if inside:
            _move_up(stage, out_dir)
        else:
            check_out_dir(out_dir)  # nothing appeared there meanwhile
            os.rename(stage, out_dir)
        published = True
    except ConfigError:
        raise
    except Exception as exc:  # OSErrors (also the Rust writers') become one line; others go on
        error = as_os_error(exc)
        if error is None:
            raise
        raise ConfigError(_error_line(error, out_dir)) from None
    finally:
        if not published:
            if stage is not None:
                shutil.rmtree(stage, ignore_errors=True)
            for d in reversed(made):
                try:
                    d.rmdir()
                except OSError:
                    pass
