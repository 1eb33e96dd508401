"""Stop signals (SIGTERM, SIGINT, a launcher's preemption signal) honoured at any point of a run.

The first signal sets a flag; the training loop reads it at its next safe point (the end of
a step, or between two evaluation batches), writes a checkpoint, marks the run
``interrupted`` and the process exits with 128 + the signal number. A sweep stops launching
jobs: the flag outlives the job, and ``cli.run_job`` refuses to start another one.

Two cases where the loop cannot get there are handled by a watchdog thread: a second
signal, or no safe point within ``trainer.stop_grace_s`` seconds of the first (one huge step,
a hung collective). Either ends the process at once with ``os._exit`` after writing the
summary as ``interrupted``; the last checkpoint on disk is kept (it is always complete:
checkpoint.save_atomic).

Why a thread and ``signal.set_wakeup_fd``: CPython runs Python signal handlers in the main
thread between bytecodes, so while that thread is inside one long C++ call (a matmul, a
backward pass) no Python handler runs at all. The C-level handler still writes the signal
number to the wakeup fd at once, and the watchdog thread reads it there (torch releases the
GIL inside its kernels). The pattern is the one asyncio uses to hear signals while blocked.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable

import torch

from normbench.errors import first_line
from normbench.runtime import distributed as dist_utils

log = logging.getLogger("normbench")

DEFAULT_GRACE_S = 30.0  # SLURM's default KillWait and torchrun's wait before SIGKILL are 30 s too


class StopSignals:
    """The process's stop-signal state; one instance, :data:`STOP`."""

    def __init__(self) -> None:
        self.signum: int | None = None  # the first stop signal caught (None: none yet)
        self.grace_s = DEFAULT_GRACE_S
        self.hint = ""  # the command that resumes this run or sweep (printed on the way out)
        self.on_stop: list[Callable[[int], None]] = []  # called in the main thread at the first signal
        self.last_words: Callable[[int, str], None] | None = None  # before os._exit (summary, lock)
        self._previous: dict[int, object] = {}  # our signals -> the handler that was there before
        self._count = 0
        self._deadline: float | None = None
        self._safe = threading.Event()
        self._exiting = threading.Lock()
        self._pipe: tuple[int, int] | None = None
        self._quit: tuple[int, int] | None = None
        self._old_wakeup = -1
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ install
    def install(self, sigs) -> list[int]:
        """Handle ``sigs`` (those not handled yet); returns the ones newly handled, for :meth:`uninstall`.
        Outside the main thread (e.g. joblib's workers) nothing is installed."""
        if threading.current_thread() is not threading.main_thread():
            return []
        added = []
        for sig in sigs:
            if sig in self._previous:
                continue
            with contextlib.suppress(ValueError, OSError):
                self._previous[sig] = signal.signal(sig, self._handle)
                added.append(sig)
        if added and self._pipe is None:
            self._start_watchdog()
        return added

    def uninstall(self, sigs) -> None:
        for sig in sigs:
            if sig in self._previous:
                with contextlib.suppress(ValueError, OSError):
                    signal.signal(sig, self._previous[sig])
                del self._previous[sig]
        if not self._previous:
            self._stop_watchdog()
            self.__init__()  # the next run in this process starts with a clean slate

    def previous(self, sig: int):
        """The handler that was installed for ``sig`` before ours (e.g. submitit's requeue handler)."""
        return self._previous.get(sig)

    # ------------------------------------------------------------------ in the loop
    def safe_point(self) -> None:
        """The loop stops cleanly from here (checkpoint, summary): the grace deadline no longer applies."""
        self._safe.set()

    @property
    def stopping(self) -> bool:
        return self.signum is not None

    # ------------------------------------------------------------------ handlers
    def _handle(self, signum, frame) -> None:  # main thread, between bytecodes
        if self.signum is not None:
            return  # a second signal: the watchdog thread ends the process
        self.signum = signum
        if not self.on_stop:  # no run in progress (between a sweep's jobs, Hydra's own work): leave now
            raise SystemExit(128 + signum)
        name = signal.Signals(signum).name
        log.warning(
            "received %s: stopping at the end of this step (another signal, or no stop within %.0f s: exit at once)",
            name,
            self.grace_s,
        )
        for callback in list(self.on_stop):
            callback(signum)

    def _start_watchdog(self) -> None:
        try:
            self._pipe, self._quit = os.pipe(), os.pipe()
            os.set_blocking(self._pipe[1], False)
            self._old_wakeup = signal.set_wakeup_fd(self._pipe[1], warn_on_full_buffer=False)
        except (ValueError, OSError):  # no wakeup fd: the Python handler alone (second signal waits)
            self._close_pipes()
            return
        self._thread = threading.Thread(target=self._watch, name="normbench-stop-watchdog", daemon=True)
        self._thread.start()

    def _stop_watchdog(self) -> None:
        if self._pipe is None:
            return
        with contextlib.suppress(ValueError, OSError):
            signal.set_wakeup_fd(self._old_wakeup)
        os.write(self._quit[1], b"q")
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._close_pipes()

    def _close_pipes(self) -> None:
        for pair in (self._pipe, self._quit):
            for fd in pair or ():
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._pipe = self._quit = None

    def _watch(self) -> None:
        read_fd, quit_fd = self._pipe[0], self._quit[0]
        while True:
            timeout = None
            if self._deadline is not None and not self._safe.is_set():
                timeout = max(0.0, self._deadline - time.monotonic())
            ready, _, _ = select.select([read_fd, quit_fd], [], [], timeout)
            if quit_fd in ready:
                return
            if read_fd in ready:
                for signum in os.read(read_fd, 512):
                    if signum not in self._previous:
                        continue
                    self._count += 1
                    if self._count == 1:
                        self._first = signum
                        self._deadline = time.monotonic() + self.grace_s
                    else:
                        self._die(signum, "a second signal arrived")
            elif self._deadline is not None and not self._safe.is_set() and time.monotonic() >= self._deadline:
                self._die(self._first, f"no safe point within trainer.stop_grace_s={self.grace_s:g} s of it")

    def _die(self, signum: int, why: str) -> None:
        """End the process now: the summary says interrupted, the last checkpoint stays."""
        if not self._exiting.acquire(blocking=False):
            return
        name = signal.Signals(signum).name
        if self.last_words is not None:
            with contextlib.suppress(Exception):
                self.last_words(signum, why)
        hint = f"; {self.hint}" if self.hint else ""
        with contextlib.suppress(Exception):
            sys.stderr.write(f"normbench: {name}: {why}: stopped at once, the last checkpoint is kept{hint}\n")
            sys.stderr.flush()
            sys.stdout.flush()
        os._exit(128 + signum)


STOP = StopSignals()


class RunSignals:
    """One run's hold on :data:`STOP`: the signals it listens to, where a caught one goes (``on_stop``)
    and what the watchdog writes before it ends the process (``last_words``).

    The preemption signal is only chained in front of a Python handler that wants it (submitit's
    requeue); without one it keeps its default action.
    """

    def __init__(self, grace_s: float, on_stop: Callable[[int], None], last_words: Callable[[int, str], None]):
        self.preempt = preemption_signals()
        wanted = [signal.SIGTERM, signal.SIGINT, *(s for s in self.preempt if callable(signal.getsignal(s)))]
        self.installed = STOP.install(wanted)
        STOP.grace_s = grace_s
        self.on_stop = on_stop
        STOP.on_stop.append(on_stop)
        STOP.last_words = last_words

    @property
    def caught(self) -> int | None:
        """A stop signal caught before this run began (a sweep stops at the next safe point)."""
        return STOP.signum

    def launcher_handler(self, signum: int | None):
        """The launcher's handler a caught preemption signal goes on to (submitit requeues the job), or None."""
        previous = STOP.previous(signum)
        return previous if signum in self.preempt and callable(previous) else None

    def quiet(self) -> None:
        """The run wrote its own end: the watchdog has no last words to add."""
        STOP.last_words = None

    def close(self) -> None:
        """Stop listening (after the lock is released: a signal from then on leaves at once)."""
        STOP.on_stop.remove(self.on_stop)
        STOP.uninstall(self.installed)


# Under torchrun the summed stop vote is read (a host read of a tensor: on a GPU, a wait for the queued work) at
# log and checkpoint steps, which sync anyway, and otherwise every VOTE_EVERY steps: at most 0.1 reads per step
# between log steps, where reading it every step cost one sync a step (OLMo-core checks its stop and preemption
# conditions every N steps too). Ten steps of GPT-2 124M take about a second on one H100, so a stop signal is
# honoured well inside the 30 s grace (trainer.stop_grace_s). Every rank reads at the same steps: they stop together.
VOTE_EVERY = 10


class StopVotes:
    """Under torchrun every rank stops at the same step: each step's vote (1 on a rank that caught a stop
    signal, from then on) is summed with the step's loss in one collective, and read only at the steps
    :func:`vote_due` names. On CUDA the host reads the previous step's sum, so it never waits for the step it
    has just queued; on CPU this step's."""

    def __init__(self, device):
        self.device, self.lag = device, device.type == "cuda"
        self.current = self.previous = None

    def ballot(self, caught: bool):

        return torch.full((), float(caught), device=self.device)

    def count(self, votes) -> None:
        self.previous, self.current = self.current, votes

    def any(self) -> bool:
        votes = self.previous if self.lag else self.current
        return votes is not None and votes.item() > 0


def vote_due(step: int, synced: bool) -> bool:
    """Whether the stop vote is read after ``step``: at a step that syncs anyway (log, checkpoint), else every
    :data:`VOTE_EVERY` steps."""
    return synced or step % VOTE_EVERY == 0


def stop_requested(trainer, due: bool) -> bool:
    """Whether the trainer stops after this step: the signal flag in one process; under torchrun the ranks'
    summed vote (:class:`StopVotes`), read only where ``due`` (:func:`vote_due`: no host read between log steps
    but every VOTE_EVERY steps), and then the largest signal any rank caught, so every rank names the same."""
    if trainer.world == 1:
        stop_now = trainer.stop_signal is not None
    elif not due:
        return False
    else:
        stop_now = trainer.loop.votes.any()
        if stop_now:
            device = trainer.loop.built.device
            trainer.stop_signal = dist_utils.any_rank_max(trainer.stop_signal or 0, device) or signal.SIGTERM
    if stop_now:
        STOP.safe_point()  # checkpoint and summary from here: the watchdog's deadline is off
    return stop_now


def preemption_signals() -> tuple[signal.Signals, ...]:
    """The signal submitit sends before a preemption or time-out (``SUBMITIT_PREEMPT_SIGNAL``, default USR2)."""
    name = os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2").upper()
    sig = getattr(signal, name if name.startswith("SIG") else f"SIG{name}", None)
    return (sig,) if isinstance(sig, signal.Signals) and sig not in (signal.SIGTERM, signal.SIGINT) else ()


# ------------------------------------------------------- the run's last steps after a signal (trainer.run)
def hand_on(trainer, handler) -> None:
    """The checkpoint is written: the launcher's handler takes the preemption signal on (submitit requeues
    this job, which then resumes, and exits); a launcher that gives up leaves the run interrupted."""
    log.info("checkpoint written; %s goes on to the launcher", signal.Signals(trainer.stop_signal).name)
    try:
        handler(trainer.stop_signal, None)
    except Exception as exc:  # submitit: not requeued (e.g. timed out too often); the checkpoint is fine
        why = first_line(exc, type(exc).__name__)
        trainer.summary["reason"] = f"{trainer.summary.get('reason')}; not requeued: {why}"[:300]
        trainer.write_summary()
        raise


def last_words(trainer, lock, signum: int, why: str) -> None:
    """The watchdog ends the process at once (normbench.train.signals): the summary says so first."""
    name = signal.Signals(signum).name
    log.warning("%s: %s: stopping at once at step %d; the last checkpoint is kept", name, why, trainer.step)
    if trainer.summary and trainer.is_main:
        reason = f"{name} at step {trainer.step} ({why}): stopped at once; resume with trainer.resume=true"
        summary = {**trainer.summary, "status": "interrupted", "reason": reason}
        trainer.rundir.write_summary_now(summary)
    lock.release()
