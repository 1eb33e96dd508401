"""Run-directory bookkeeping: the lock that keeps two runs out of one directory, and
the config check that decides whether a checkpoint may be resumed.

A resume refuses a checkpoint made with different model keys (they define the
weights), allows the keys that do not change the computation, and allows any
other key only when ``trainer.resume_allow_changed`` names it.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import time
from pathlib import Path

from omegaconf import OmegaConf

from normbench.errors import ConfigError

# Keys that define the model: a checkpoint can never be resumed with these changed.
MODEL_KEYS = ("model", "arch", "norm", "data.name", "data.tokenizer", "data.vocab_size", "data.paths", "data.hf_path")
# Overrides that say how a job runs, not what it computes: left out of job dir names (conf/config.yaml
# hydra.job.config.override_dirname.exclude_keys), W&B run names and the report's groups.
BOOKKEEPING_KEYS = ("trainer.resume", "trainer.resume_allow_changed", "logger", "logger.wandb.mode")
# Keys that may always differ on resume (they do not change the computation).
FREE_KEYS = (
    "trainer.resume",
    "trainer.resume_allow_changed",
    "trainer.log_every",
    "trainer.eval_every",
    "trainer.ckpt_every",
    "data.cache_dir",
    "logger",
    "device",
    "diag.every",
    "parallel",  # how, not what: checkpoints are full state dicts, resumable under any world size
    "compile",
    "peak_flops",
    "trainer.stop_grace_s",
    "trainer.skip_memory_check",
)


def flat_config(cfg) -> dict:
    out = {}

    def walk(node, prefix):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}{k}.")
        else:
            out[prefix[:-1]] = node

    walk(OmegaConf.to_container(cfg, resolve=True), "")
    return out


# Keys added after runs were made, with the value that computes what those runs computed: a
# checkpoint without the key resumes under that value (and only under it).
ADDED_KEYS: dict[str, object] = {
    "arch.attn_gate": "none",
    "arch.scale_resids": False,
    "arch.gain_offset": False,
    "arch.dssn_c_attn": None,
    "arch.dssn_c_mlp": None,
    "arch.tiny_init": False,
}


def _canonical(flat: dict) -> dict:
    """Old spellings in their current form: a boolean ``arch.qk_norm`` (true -> head, false -> none)."""
    from normbench.config import qk_norm_mode

    out = dict(flat)
    if "arch.qk_norm" in out:
        out["arch.qk_norm"] = qk_norm_mode(out["arch.qk_norm"])
    return out


def config_diff(old: dict, new: dict) -> list[str]:
    old, new = _canonical(old), _canonical(new)
    old = {**{k: v for k, v in ADDED_KEYS.items() if k in new and k not in old}, **old}
    return sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))


def _changes(keys: list[str], old: dict, new: dict) -> str:
    """``key (checkpoint -> now)`` for the first few keys, one line."""
    shown = ", ".join(f"{k} ({_short(old.get(k, '<absent>'))} -> {_short(new.get(k, '<absent>'))})" for k in keys[:6])
    return shown + (f" and {len(keys) - 6} more" if len(keys) > 6 else "")


def _short(value) -> str:
    text = str(value).replace("\n", " ")
    return text if len(text) <= 40 else text[:37] + "..."


def check_resume_config(old: dict, new: dict, allowed: list[str], path: Path) -> list[str]:
    """The keys that differ from the checkpoint's config; ConfigError if any may not (one line, names them)."""
    diff = [k for k in config_diff(old, new) if not any(k == f or k.startswith(f + ".") for f in FREE_KEYS)]
    model_diff = [k for k in diff if any(k == m or k.startswith(m + ".") for m in MODEL_KEYS)]
    if model_diff:
        raise ConfigError(
            f"checkpoint {path} was made with a different model: {_changes(model_diff, old, new)} "
            "(model keys can never change on resume; use a new run directory)"
        )
    refused = [k for k in diff if "all" not in allowed and not any(k == a or k.startswith(a + ".") for a in allowed)]
    if refused:
        raise ConfigError(
            f"checkpoint {path} was made with a different config: {_changes(refused, old, new)} "
            f"(allow with trainer.resume_allow_changed=[{','.join(refused[:8])}])"
        )
    return diff


def job_dir_name(override_dirname: str, limit: int = 200) -> str:
    """A sweep job's directory name (after ``<job num>_``): Hydra's ``override_dirname``, flat.

    A value holding a path (``data.paths=[data/a.txt,/abs/b.txt]``) would nest the job directory
    several levels deep; each path keeps only its last part (``data.paths=[a.txt,b.txt]``; the job
    number keeps the names unique). A name past ``limit`` characters (file names end at 255 bytes)
    is cut, with a hash of the whole so that it stays unique and the same on every resume.
    """
    import hashlib
    import re

    last_part = lambda m: m.group(0).rstrip("/").rsplit("/", 1)[-1]  # noqa: E731
    name = re.sub(r"[^,=\[\]{}()]*/[^,=\[\]{}()]*", last_part, override_dirname)
    if len(name.encode()) > limit:
        digest = hashlib.sha1(override_dirname.encode()).hexdigest()[:8]
        name = name.encode()[: limit - 9].decode(errors="ignore") + "~" + digest
    return name


class RunDirInUse(ConfigError):
    """Another live process trains into this run directory."""


class RunLock:
    """``run_dir/.lock``: an exclusive ``flock`` held while the run lives, its owner ``host:pid`` inside.

    The kernel drops a flock when its process dies, kill -9 included, so a dead run's
    lock never blocks: a ``.lock`` file that no process holds is taken over with a one-line
    notice naming the dead owner (a clean exit removes the file, so a leftover one always
    means a run that died without a word: kill -9, out of memory, a lost node). An owner on
    another host is taken over the same way (a requeue onto another node), unless that run
    wrote to the directory in the last ``FRESH_S`` seconds: flock is not coherent across
    hosts on every network filesystem, so a run that looks alive is refused. On a filesystem
    without flock the owner's pid decides: dead on this host -> taken over; alive, or on
    another host -> refused (remove the file if that run is gone).
    """

    FRESH_S = 120.0

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / ".lock"
        self.fd: int | None = None
        self.held = False

    def acquire(self) -> None:
        me = f"{socket.gethostname()}:{os.getpid()}"
        for _ in range(5):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise self._in_use() from None
            except OSError:  # no flock on this filesystem
                os.close(fd)
                self._acquire_by_pid(me)
                return
            try:
                same_file = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same_file = False
            if not same_file:  # the owner removed the file as we opened it: lock the new one
                os.close(fd)
                continue
            previous = os.read(fd, 256).decode(errors="replace").strip()
            if previous and previous != me:
                try:
                    self._take_over(previous)
                except RunDirInUse:
                    os.close(fd)
                    raise
            os.ftruncate(fd, 0)
            os.pwrite(fd, me.encode(), 0)
            self.fd, self.held = fd, True
            return
        raise self._in_use()

    def _take_over(self, owner: str) -> None:
        """The lock file of a process that died holding it: say so (or refuse a foreign host's fresh run)."""
        host, _, pid = owner.partition(":")
        age = self._last_write_age()
        where = "" if age is None else f", last wrote {_age(age)} ago"
        if host != socket.gethostname():
            if age is not None and age < self.FRESH_S:
                raise RunDirInUse(
                    f"run directory {self.path.parent} is locked by {owner} on another host, which wrote to it "
                    f"{_age(age)} ago; if that run is gone, delete {self.path} (or choose another hydra.run.dir)"
                )
            gone = f"on another host, no longer holding it{where}"
        else:
            gone = f"process {pid} is gone{where}"
        status = self._summary_note()
        logging.getLogger("normbench").warning(
            "note: stale lock in %s from %s (%s%s): taken over", self.path.parent, owner, gone, status
        )

    def _last_write_age(self) -> float | None:
        run = self.path.parent
        times = [p.stat().st_mtime for p in (run / "metrics.jsonl", run / "summary.json") if p.exists()]
        return max(0.0, time.time() - max(times)) if times else None

    def _summary_note(self) -> str:
        try:
            summary = json.loads((self.path.parent / "summary.json").read_text())
        except (OSError, ValueError):
            return ""
        if isinstance(summary, dict) and summary.get("status") == "running":
            return f"; it died at step {summary.get('step')} without a word (killed, or out of memory?)"
        return ""

    def check_free(self) -> None:
        """Raise RunDirInUse if a live process holds the lock (without taking it)."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
        except BlockingIOError:
            raise self._in_use() from None
        except OSError:
            if self._owner_alive():
                raise self._in_use() from None
        finally:
            os.close(fd)

    def _owner(self) -> str:
        try:
            return self.path.read_text(errors="replace").strip()
        except OSError:
            return ""

    def _owner_alive(self) -> bool:
        host, _, pid = self._owner().partition(":")
        if host and host != socket.gethostname():
            return True  # cannot tell from here
        return pid.isdigit() and int(pid) != os.getpid() and _pid_alive(int(pid))

    def _acquire_by_pid(self, me: str) -> None:
        if self._owner_alive():
            raise self._in_use()
        if (owner := self._owner()) and owner != me:
            self._take_over(owner)
        self.path.write_text(me)  # stale (its process is dead) or ours
        self.held = True

    def _in_use(self) -> RunDirInUse:
        return RunDirInUse(
            f"run directory {self.path.parent} is in use by process {self._owner() or '(unknown)'} "
            f"(lock {self.path}); wait for that run to end or choose another hydra.run.dir"
        )

    def release(self) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)  # before the flock goes, so no one locks a removed file
            if self.fd is not None:
                os.close(self.fd)
            self.fd, self.held = None, False


def _age(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
