"""The run directory: its layout (:class:`RunDir`, the one place that names its files) and the name
of a sweep job's directory. Reading a run back is run/reader.py; the lock that keeps two runs out of
one directory is run/lock.py; the config check that decides whether a checkpoint may be resumed is
run/resume.py.

A run directory (docs/contract.md §3) holds ``.hydra/`` (Hydra's config.yaml, overrides.yaml,
hydra.yaml), ``metrics.jsonl``, ``summary.json``, ``checkpoints/last.pt`` (and ``checkpoints/
replaced-<time>.pt``, one a fresh run set aside), ``train.log``, ``layer_skip.json`` (written by
``reproduce``'s layer-skip evaluation), ``eval.json`` (``normbench eval``'s downstream scores) and,
while a trainer lives, ``.lock`` (``host:pid``). Every module asks :class:`RunDir` for these paths,
reads the summary through :meth:`RunDir.read_summary` and the lock's owner through
:meth:`RunDir.lock_owner`; ``summary.json`` is only ever replaced atomically (:meth:`RunDir.write_summary`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import time
import warnings
from pathlib import Path

from normbench.run.metrics import JsonlWriter, read_jsonl, write_json_atomic

UNREADABLE = "unreadable"  # the status of a run whose summary.json exists but cannot be parsed
TMP_MARK = ".tmp."  # metrics.write_atomic's temp files: .<name>.tmp.<pid>


class RunDir:
    """One run's directory: where each file lives, and how the summary and the lock's owner are read."""

    def __init__(self, path: Path | str):
        self.path = Path(path)

    @property
    def summary_path(self) -> Path:
        return self.path / "summary.json"

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def lock_path(self) -> Path:
        return self.path / ".lock"

    @property
    def checkpoint_path(self) -> Path:
        return self.path / "checkpoints" / "last.pt"

    @property
    def hydra_dir(self) -> Path:
        return self.path / ".hydra"

    @property
    def config_path(self) -> Path:
        return self.hydra_dir / "config.yaml"

    @property
    def overrides_path(self) -> Path:
        return self.hydra_dir / "overrides.yaml"

    @property
    def log_path(self) -> Path:
        return self.path / "train.log"

    @property
    def layer_skip_path(self) -> Path:
        return self.path / "layer_skip.json"

    @property
    def eval_path(self) -> Path:
        return self.path / "eval.json"

    # ---------------------------------------------------------------------------- summary
    def read_summary(self) -> dict | None:
        """``summary.json``: None when there is none; when it exists but is not a JSON object (damaged
        by hand or by a full disk: it is written atomically) a summary whose status is ``unreadable``,
        so no reader mistakes it for a failed run."""
        try:
            text = self.summary_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            return {"status": UNREADABLE, "reason": f"summary.json cannot be read ({type(exc).__name__})"}
        try:
            summary = json.loads(text)
        except (ValueError, RecursionError) as exc:
            return {"status": UNREADABLE, "reason": f"summary.json is not valid JSON ({str(exc)[:80]})"}
        if not isinstance(summary, dict):
            return {"status": UNREADABLE, "reason": "summary.json is not a JSON object"}
        return summary

    def status(self) -> str | None:
        return (self.read_summary() or {}).get("status")

    def write_summary(self, summary: dict) -> None:
        write_json_atomic(summary, self.summary_path)

    def write_summary_now(self, summary: dict) -> None:
        """From the watchdog thread (signals.py), its own temp name: the main thread may be writing too."""
        tmp = self.summary_path.with_name(f".summary.json.tmp.{os.getpid()}.exit")
        tmp.write_text(json.dumps(summary, indent=2, default=str) + "\n", encoding="utf-8")
        os.replace(tmp, self.summary_path)

    def record_failure(self, cfg, reason: str, status: str = "failed") -> None:
        """A job that failed before training could write its own summary (sweeps go on)."""
        summary = self.read_summary() or {}
        names = {"arch": cfg.arch.name, "norm": cfg.norm.name, "optim": cfg.optim.name, "seed": cfg.seed}
        self.write_summary({**summary, "status": status, "reason": reason, **names})

    # ---------------------------------------------------------------------------- metrics
    def metrics_writer(self, resume_step: int | None = None) -> JsonlWriter:
        return JsonlWriter(self.metrics_path, resume_step=resume_step)

    def last_logged_step(self) -> int | None:
        """The last step ``metrics.jsonl`` holds (past the last checkpoint when the run was killed); None if none."""
        return max((r["step"] for r in read_jsonl(self.metrics_path) if type(r.get("step")) is int), default=None)

    def checkpoint_step(self) -> int | None:
        """The step of ``checkpoints/last.pt``, its tensors left unread (memory-mapped); None when there is
        none or it cannot be read. For a notice only: no CRC-32 check (train/checkpoint.py's ``load``
        refuses a damaged file in its own line)."""

        import torch  # here: the lock's other users (the CLI's checks) need no torch

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                state = torch.load(self.checkpoint_path, map_location="cpu", weights_only=True, mmap=True)
        except Exception:  # missing, truncated, corrupt, foreign: the resume says why
            return None
        step = state.get("step") if isinstance(state, dict) else None
        return step if type(step) is int else None

    # ---------------------------------------------------------------------------- temp files
    def stale_temp_files(self) -> list[Path]:
        """Temp files of atomic writes (``summary.json``, ``metrics.jsonl``, checkpoints) whose writer is not
        this process: a writer killed mid-write (kill -9, out of memory) cannot remove its own."""
        found = [*self.path.glob(f".summary.json{TMP_MARK}*"), *self.path.glob(f".metrics.jsonl{TMP_MARK}*")]
        found += self.checkpoint_path.parent.glob(f".*.pt{TMP_MARK}*")
        mine = str(os.getpid())  # ours may be in flight (the watchdog's exit write, or the main thread's)
        return [p for p in found if p.name.rsplit(TMP_MARK, 1)[1].split(".")[0] != mine]

    def remove_stale_temp_files(self) -> None:
        """Only the run holding the lock calls this (run/lock.py): no other live writer can own them."""
        for stale in self.stale_temp_files():
            stale.unlink(missing_ok=True)

    # ---------------------------------------------------------------------------- lock
    def lock_owner(self) -> tuple[str, str]:
        """(host, pid) from ``.lock`` (``host:pid``); ("", "") when there is none."""
        try:
            host, _, pid = self.lock_path.read_text(errors="replace").strip().partition(":")
        except OSError:
            return "", ""
        return host, pid

    def owner_alive(self, count_self: bool = True) -> bool:
        """Whether the process named in ``.lock`` still lives (read-only: never takes the lock). An
        owner on another host counts as alive (cannot tell from here); this very process counts
        unless ``count_self`` is false (the lock's own checks)."""
        host, pid = self.lock_owner()
        if not host:
            return False
        if host != socket.gethostname():
            return True
        return pid.isdigit() and (count_self or int(pid) != os.getpid()) and _pid_alive(int(pid))

    def last_write_age(self) -> float | None:
        """Seconds since the run last wrote ``metrics.jsonl`` or ``summary.json``; None if neither exists."""
        times = [p.stat().st_mtime for p in (self.metrics_path, self.summary_path) if p.exists()]
        return max(0.0, time.time() - max(times)) if times else None


def job_dir_name(override_dirname: str, limit: int = 200) -> str:
    """A sweep job's directory name (after ``<job num>_``): Hydra's ``override_dirname``, flat.

    A value holding a path (``data.paths=[data/a.txt,/abs/b.txt]``) would nest the job directory
    several levels deep; each path keeps only its last part (``data.paths=[a.txt,b.txt]``; the job
    number keeps the names unique). A name past ``limit`` characters (file names end at 255 bytes)
    is cut, with a hash of the whole so that it stays unique and the same on every resume.
    """

    last_part = lambda m: m.group(0).rstrip("/").rsplit("/", 1)[-1]
    name = re.sub(r"[^,=\[\]{}()]*/[^,=\[\]{}()]*", last_part, override_dirname)
    if len(name.encode()) > limit:
        digest = hashlib.sha1(override_dirname.encode()).hexdigest()[:8]
        name = name.encode()[: limit - 9].decode(errors="ignore") + "~" + digest
    return name


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
