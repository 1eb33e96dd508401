"""The run directory: its layout (:class:`RunDir`, the one place that names its files), the lock
that keeps two runs out of one directory, and the config check that decides whether a
checkpoint may be resumed.

A run directory (docs/contract.md §3) holds ``.hydra/`` (Hydra's config.yaml, overrides.yaml,
hydra.yaml), ``metrics.jsonl``, ``summary.json``, ``checkpoints/last.pt``, ``train.log`` and, while
a trainer lives, ``.lock`` (``host:pid``). Every module asks :class:`RunDir` for these paths, reads
the summary through :meth:`RunDir.read_summary` and the lock's owner through :meth:`RunDir.lock_owner`;
``summary.json`` is only ever replaced atomically (:meth:`RunDir.write_summary`).

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

from normbench.config.schema import as_dict
from normbench.errors import ConfigError
from normbench.run.metrics import JsonlWriter, read_jsonl, write_json_atomic

UNREADABLE = "unreadable"  # the status of a run whose summary.json exists but cannot be parsed


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

    def read_metrics(self) -> list[dict]:
        return read_jsonl(self.metrics_path)

    # ---------------------------------------------------------------------------- lock
    def lock(self) -> RunLock:
        return RunLock(self.path)

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

    walk(as_dict(cfg), "")
    return out


# Keys added after runs were made, with the value that computes what those runs computed: a
# checkpoint without the key resumes under that value (and only under it). A callable gets the new
# run's flat config (the old value can depend on, e.g., the norm).
ADDED_KEYS: dict[str, object] = {
    "arch.attn_gate": "none",
    "arch.scale_resids": False,
    "arch.gain_offset": False,
    "arch.dssn_c_attn": None,
    "arch.dssn_c_mlp": None,
    "arch.tiny_init": False,
    "model.fixnorm": False,
    "norm.allow_leak": False,
    "norm.bn_momentum": 0.05,
    "norm.pn_alpha_fwd": 0.9,
    "norm.pn_alpha_bkw": 0.9,
    "norm.pn_groups": 1,
    "norm.pn_warmup": 0,
    "norm.seed_alpha_init": 1.0,
    "norm.seed_heads": 1,
    # SeeDNorm runs made before the key had SeeDNorm at the final norm too; for other norms it is inert
    "norm.seed_final": lambda new: new.get("norm.name") == "seednorm" or new.get("norm.seed_final"),
    "optim.qk_clip": False,
    "optim.qk_clip_tau": 100.0,
}


def _canonical(flat: dict) -> dict:
    """Old spellings in their current form: a boolean ``arch.qk_norm`` (true -> head, false -> none);
    ``norm.width_init`` as the ``model.init_std`` it computed (config.upgrade_legacy); ``model.init_std:
    auto`` as the number it resolves to, so an old run that drew that number resumes under ``auto``."""
    from normbench.config.schema import init_std_of, qk_norm_mode, upgrade_legacy

    out = upgrade_legacy(flat)
    if "model.init_std" in out and "model.d_model" in out:
        out["model.init_std"] = init_std_of(out["model.init_std"], out["model.d_model"])
    if "arch.qk_norm" in out:
        out["arch.qk_norm"] = qk_norm_mode(out["arch.qk_norm"])
    return out


def config_diff(old: dict, new: dict) -> list[str]:
    old, new = _canonical(old), _canonical(new)
    added = {k: v(new) if callable(v) else v for k, v in ADDED_KEYS.items() if k in new and k not in old}
    old = {**added, **old}
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
        self.run = RunDir(run_dir)
        self.path = self.run.lock_path
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
        age = self.run.last_write_age()
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

    def _summary_note(self) -> str:
        summary = self.run.read_summary() or {}
        if summary.get("status") == "running":
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
            if self.run.owner_alive(count_self=False):
                raise self._in_use() from None
        finally:
            os.close(fd)

    def _owner(self) -> str:
        host, pid = self.run.lock_owner()
        return f"{host}:{pid}" if host else ""

    def _acquire_by_pid(self, me: str) -> None:
        if self.run.owner_alive(count_self=False):
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
