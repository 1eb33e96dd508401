"""``run_dir/.lock``: the lock that keeps two live runs out of one run directory."""

from __future__ import annotations

import fcntl
import logging
import os
import socket
from pathlib import Path

from normbench.errors import ConfigError
from normbench.run.rundir import RunDir


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

    The holder owns the directory, so taking the lock and leaving it also sweep the temp files of
    atomic writes that a killed writer left (:meth:`RunDir.remove_stale_temp_files`). ``resume``
    (``trainer.resume``; None: not known) lets the take-over notice say where this run goes on from.
    """

    FRESH_S = 120.0

    def __init__(self, run_dir: Path, resume: bool | None = None):
        self.run = RunDir(run_dir)
        self.resume = resume
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
            self.run.remove_stale_temp_files()
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
        logging.getLogger("normbench").warning(
            "note: stale lock in %s from %s (%s): taken over; %s", self.path.parent, owner, gone, self._left_note()
        )

    def _left_note(self) -> str:
        """What the dead owner left: the last step it logged (metrics.jsonl, which runs past the last
        checkpoint) and the step this run goes on from (the checkpoint's, not summary.json's)."""
        status = (self.run.read_summary() or {}).get("status")
        died = "it died without a word (killed, or out of memory?) " if status in (None, "running") else ""
        logged = self.run.last_logged_step()
        text = died + ("before logging a step" if logged is None else f"after logging step {logged} (metrics.jsonl)")
        return f"{text}; {self._goes_on_from()}"

    def _goes_on_from(self) -> str:
        path = self.run.checkpoint_path
        step = self.run.checkpoint_step() if path.is_file() else None
        if path.is_file() and step is None:
            return f"its checkpoint {path} cannot be read"
        if self.resume is False:
            kept = "" if step is None else f" (its checkpoint of step {step} is set aside)"
            return f"trainer.resume=false: this run starts over from step 0{kept}"
        if step is None:
            return "no checkpoint: this run starts from step 0" if self.resume else "no checkpoint yet"
        return f"this run resumes from its checkpoint at step {step}" if self.resume else f"its checkpoint: step {step}"

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
        self.run.remove_stale_temp_files()

    def _in_use(self) -> RunDirInUse:
        return RunDirInUse(
            f"run directory {self.path.parent} is in use by process {self._owner() or '(unknown)'} "
            f"(lock {self.path}); wait for that run to end or choose another hydra.run.dir"
        )

    def release(self) -> None:
        if self.held:
            self.run.remove_stale_temp_files()  # still the owner: none can be a live writer's
            self.path.unlink(missing_ok=True)  # before the flock goes, so no one locks a removed file
            if self.fd is not None:
                os.close(self.fd)
            self.fd, self.held = None, False


def _age(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"
