"""The training loop: causal-LM pretraining with the run directory of docs/contract.md §3.

Laid out as torchtitan's trainer: :func:`normbench.train.build.build` makes the components,
:class:`normbench.train.state.TrainState` is what a checkpoint holds, :class:`normbench.runtime.throughput.
Throughput` times the steps, all of it held as one :class:`Loop`, and :meth:`Trainer.fit` is the algorithm:
set the LR, forward/backward over micro-batches, clip, step, re-normalize (nGPT), log, checkpoint, stop on a
signal (train/signals.py wires them). What happens at diagnostic, validation and downstream-evaluation steps
is a callback behind one small protocol (train/callbacks.py, after OLMo-core's): each says which steps'
records it writes into and acts at fixed points of the step. The loop's stateful parts (train/loop_parts.py:
evaluation, checkpoints, loss watching) each say when they are due.

Determinism: on CPU the same seed gives the same losses to the last bit, and a resumed run
continues exactly (the schedule is a pure function of the step; everything else is in the state).

Extension points (tests use them, as may plugins named by ``NORMBENCH_PLUGINS``, cli/__init__.py): callbacks
(``run(cfg, run_dir, callbacks=[...])``), :meth:`Trainer.forward_backward` (one step's gradients),
:meth:`Trainer.eval_loss` (one validation batch), :meth:`Trainer.optimizer_step`, :meth:`Trainer.save_checkpoint`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from normbench.diag.diagnostics import SpikeDetector
from normbench.diag.recorder import Recorder
from normbench.errors import ConfigError, first_line
from normbench.optim.optimizers import lr_factor, set_lr
from normbench.run.lock import RunLock
from normbench.run.rundir import RunDir
from normbench.runtime import distributed as dist_utils
from normbench.runtime.precision import precision_name
from normbench.runtime.throughput import Throughput
from normbench.train import build as builder
from normbench.train.callbacks import Callback, Diagnose, Validate
from normbench.train.ckpt_writer import CheckpointWriter
from normbench.train.loop_parts import Checkpoints, Evaluation, LossWatch
from normbench.train.signals import RunSignals, StopVotes, hand_on, last_words, stop_requested, vote_due
from normbench.train.state import TrainState
from normbench.validation import prepare

log = logging.getLogger("normbench")


class Interrupted(Exception):
    pass


class Diverged(Exception):
    """The run diverged (its reason: train/loop_parts.LossWatch); it ends with status ``diverged``."""


@dataclass
class Loop:
    """What the trainer runs, declared in one place: the built components (train/build.py) and the
    loop's stateful parts (loop_parts.py), each saying when it is due."""

    built: builder.Components  # what train/build.py made: model, optimizer, data, device, settings
    state: TrainState  # what a checkpoint holds (the parts' state included)
    meter: Throughput
    recorder: Recorder
    evals: Evaluation
    ckpts: Checkpoints
    writer: CheckpointWriter  # the checkpoint's format, and whether it is written in the background
    losses: LossWatch
    votes: StopVotes  # torchrun: which ranks caught a stop signal
    callbacks: list[Callback]  # diagnostics, validation, then the caller's (train/callbacks.py)


class Trainer:
    def __init__(self, cfg, run_dir: Path, callbacks: Sequence[Callback] = ()):
        self.cfg, self.run_dir, self.rundir = cfg, Path(run_dir), RunDir(run_dir)
        self.extra_callbacks = list(callbacks)  # after the trainer's own (train/callbacks.py)
        self.rank, self.world = dist_utils.rank(), dist_utils.world_size()
        self.is_main = self.rank == 0
        self.stop_signal: int | None = None
        self.summary: dict = {}
        self.loop: Loop | None = None

    # the components the extension points and plugins reach for
    @property
    def state(self) -> TrainState | None:
        return self.loop.state if self.loop is not None else None

    @property
    def step(self) -> int:
        return self.loop.state.step if self.loop is not None else 0

    @property
    def model(self) -> torch.nn.Module:
        return self.loop.built.model

    @property
    def raw_model(self) -> torch.nn.Module:
        return self.loop.built.raw_model

    @property
    def max_steps(self) -> int:
        return self.loop.built.length.max_steps

    @property
    def recorder(self) -> Recorder:
        return self.loop.recorder

    @property
    def validation(self) -> Validate:
        return next(cb for cb in self.loop.callbacks if isinstance(cb, Validate))

    # ------------------------------------------------------------------ setup
    def setup(self) -> None:
        self.cfg, notes = prepare(self.cfg)  # typed and validated, once (validation.validate)
        cfg = self.cfg
        built = builder.build(cfg, self.rank, self.world, notes)
        meter = Throughput(built.tokens_per_step, built.device)
        evals = Evaluation(built.settings.eval_every, built.length.max_steps)
        spike = SpikeDetector(cfg.diag.spike_factor, cfg.diag.spike_window)
        losses = LossWatch(built.settings.diverge_factor, built.settings.max_skipped, spike)
        state = TrainState(cfg, built, meter, evals, losses, self.summary)
        ckpt_dir = self.rundir.checkpoint_path.parent  # last.pt, or sharded step_<N>.dcp (train/ckpt_store.py)
        resumed = state.resume(ckpt_dir, cfg, built.length.max_steps, built.sched)
        recorder = Recorder(cfg, self.rundir, built, state, meter, resumed)
        ckpts = Checkpoints(
            built.settings.ckpt_every, built.length.max_steps, built.settings.save_at, built.settings.ckpt_every_s
        )
        writer = CheckpointWriter.for_run(
            cfg, built, ckpt_dir, meter, self.rundir.write_summary if self.is_main else None
        )
        callbacks = [Diagnose(built.diag, cfg.diag.every, built.length.max_steps), Validate(evals)]
        callbacks += self.extra_callbacks
        for callback in callbacks:
            callback.trainer = self
        self.loop = Loop(
            built, state, meter, recorder, evals, ckpts, writer, losses, StopVotes(built.device), callbacks
        )
        recorder.start()

    # ------------------------------------------------------------------- loop
    def fit(self) -> dict:
        loop, built, state = self.loop, self.loop.built, self.loop.state
        loop.meter.start(state.step)  # wall clock and steady-state throughput go on across a resume
        self.validation.finish_missing()  # interrupted during this step's evaluation: do it now, into its record
        log.info(
            "training %d steps (%s tokens/step, %d already done) on %s, precision %s",
            *(self.max_steps, f"{built.tokens_per_step:,}", state.step, built.device, precision_name(self.cfg)),
        )
        self.model.train()
        try:
            while state.step < self.max_steps:
                step = state.step + 1  # the step running, numbered as the records number it
                log_now = self.log_due(step)  # planned before the step: a log step is a host sync
                loop.meter.step_start(state.step)
                lr = set_lr(built.optimizer, lr_factor(state.step, self.max_steps, built.sched))
                self.each("pre_step", step)
                loss, grad_norm = self.train_step()
                self.each("pre_optim_step", step)
                self.optimizer_step(grad_norm)
                self.each("post_optim_step", step)
                loop.losses.add(loss)
                state.step, state.tokens = step, state.tokens + built.tokens_per_step
                if log_now:
                    self.log_step(lr, grad_norm)
                self.checkpoint_or_stop(log_now)
            self.save_checkpoint()
        except Diverged as diverged:
            return self._finish("diverged", str(diverged))
        return self._finish("completed", None)

    def each(self, hook: str, step: int) -> None:
        """Call ``hook`` on every callback, in order (train/callbacks.py)."""
        for callback in self.loop.callbacks:
            getattr(callback, hook)(step)

    def log_due(self, step: int) -> bool:
        """Whether ``step`` ends with a log step: every ``trainer.log_every`` steps, the last one, and wherever a
        callback writes into the record (diagnostics, validation, downstream tasks)."""
        every = self.loop.built.settings.log_every
        return step % every == 0 or step == self.max_steps or any(cb.wants_record(step) for cb in self.loop.callbacks)

    def checkpoint_or_stop(self, logged: bool) -> None:
        """A checkpoint when one is due (by steps, or by time, asked at log steps where the device is synced) or a
        stop signal was caught; then, on a signal, the run stops (also during the last step or its evaluation:
        the resume finishes the run)."""
        loop, step = self.loop, self.loop.state.step
        due = loop.ckpts.due(step)
        if logged:  # a background checkpoint that has ended is committed; a checkpoint by time is due
            loop.writer.poll()
            due = due or loop.ckpts.time_due(step, loop.built.device)
        stop_now = stop_requested(self, vote_due(step, synced=logged or due))
        if stop_now or due:
            self._flush_losses()
            self.save_checkpoint()
        if stop_now:
            self._interrupt()

    # ------------------------------------------------------------------ steps
    def train_step(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Gradients of one global batch; returns (mean loss over all ranks, grad norm before clipping)."""
        built = self.loop.built
        micro_batches = built.batches.global_step(built.settings.grad_accum, self.rank, self.world)
        loss_sum = self.forward_backward(micro_batches)
        scale = 1.0 / built.settings.grad_accum
        if self.world > 1:  # one collective: the global loss, and how many ranks caught a stop signal
            vote = self.loop.votes.ballot(self.stop_signal is not None)
            reduced = dist_utils.all_reduce_sum(torch.stack([loss_sum, vote]))
            loss_mean = reduced[0] * scale
            self.loop.votes.count(reduced[1])
        else:
            loss_mean = loss_sum * scale
        if built.scaler is not None:
            for opt in built.optimizer.optimizers:
                built.scaler.unscale_(opt)
        self.each("pre_clip", self.step + 1)
        clip = built.settings.grad_clip if built.settings.grad_clip > 0 else math.inf
        grad_norm = dist_utils.clip_grad_norm_(built.raw_model.parameters(), clip)  # total over FSDP shards too
        return loss_mean, grad_norm

    def forward_backward(self, micro_batches: list) -> torch.Tensor:
        """Accumulate this rank's gradients over its micro-batches; returns the sum of their losses."""
        built = self.loop.built
        loss_sum = torch.zeros((), device=built.device)
        # this rank's mean; DDP/FSDP average over ranks, so the gradient is the global-batch mean
        grad_scale = 1.0 / len(micro_batches)
        for i, (x, y) in enumerate(micro_batches):
            with dist_utils.maybe_no_sync(built.model, i == len(micro_batches) - 1), built.autocast():
                _, loss = built.model(x, y)
            loss_for_grad = loss * grad_scale
            if built.scaler is not None:
                loss_for_grad = built.scaler.scale(loss_for_grad)
            loss_for_grad.backward()
            loss_sum += loss.detach()
        return loss_sum

    def optimizer_step(self, grad_norm: torch.Tensor) -> bool | torch.Tensor:
        """Step the optimizer; returns whether it stepped, as a 0-dim bool tensor where only the device knows:
        nothing here reads a value on the host (a device sync on a GPU), the skips are counted on the device and
        read at the next log step (LossWatch.count).

        fp16: GradScaler skips a step whose gradients overflowed and lowers the loss scale, a routine event
        counted in ``amp_skipped`` (never toward ``trainer.max_skipped``; a real divergence shows in the loss).
        Otherwise, with ``trainer.skip_nonfinite``, a step whose gradient norm is not finite has its gradients
        zeroed on the device (no NaN/inf reaches the weights or the optimizer's moments), is counted in
        ``skipped``, and the optimizer steps on the zeros (docs/reliability.md: the semantics since issue 51).
        """
        built, losses = self.loop.built, self.loop.losses
        stepped: bool | torch.Tensor = True
        if built.scaler is not None:
            before = built.scaler._scale.clone()  # torch's public get_scale() is a host read; the tensor is not
            for opt in built.optimizer.optimizers:
                built.scaler.step(opt)
            built.scaler.update()
            stepped = built.scaler._scale >= before  # lowered: the scaler skipped this step
            losses.count("amp_skipped", ~stepped)
        else:
            if built.settings.skip_nonfinite:
                stepped = torch.isfinite(grad_norm)
                dist_utils.zero_grads_unless(built.raw_model.parameters(), stepped)
                losses.count("skipped", ~stepped)
            built.optimizer.step()
        built.raw_model.after_step()  # nGPT re-normalization, outside any compiled graph (after a skip: idempotent)
        if built.qk_clip is not None:  # every step (a skipped one only resets), so DDP ranks stay in step
            built.qk_clip.step(apply=stepped)
        built.optimizer.zero_grad(set_to_none=True)
        return stepped

    def eval_loss(self, batch: torch.Tensor) -> torch.Tensor:
        """One validation batch's mean loss (the validation callback averages them: train/callbacks.Validate)."""
        built = self.loop.built
        batch = batch.to(built.device, non_blocking=True)  # a no-op for the run's own (on the device since build)
        with built.autocast():
            _, loss = built.model(batch[:, :-1], batch[:, 1:])
        return loss.float()

    # --------------------------------------------------------- log, stop, checkpoint
    def log_step(self, lr: float, grad_norm: torch.Tensor) -> None:
        """The record of a log step: the losses since the last one synced and checked, the step's own values, then
        the callbacks' (diagnostics, validation, ...); raises :class:`Diverged` after writing it, if it diverged."""
        loop, built, state = self.loop, self.loop.built, self.loop.state
        # first: it waits for the device, so the window holds all its work
        tps, step_time = loop.meter.window(state.step)
        losses, status = loop.losses.drain(state.step, state)
        record = loop.recorder.step_record(losses[-1], lr, grad_norm.item(), tps, step_time)
        record["spikes"] = loop.losses.spike.count  # loss spikes so far (diagnostics.SpikeDetector)
        record.update(built.qk_clip.metrics() if built.qk_clip is not None else {})
        if spike_steps := loop.losses.spike.pop_steps():
            record["spike_steps"] = spike_steps
        for callback in loop.callbacks:
            callback.on_record(state.step, record, diverged=status is not None)
        loop.recorder.log(record, tps)
        if status is not None:
            raise Diverged(status)

    def _flush_losses(self) -> None:
        """Before a checkpoint, the losses since the last log step get a log step's bookkeeping, so the
        checkpoint takes the spike/divergence state and a resume continues it exactly; :class:`Diverged` if
        they diverged (no checkpoint is written then)."""
        state = self.loop.state
        losses, status = self.loop.losses.drain(state.step, state)
        if status is not None:
            raise Diverged(status)
        if losses:
            self.loop.recorder.final_loss(losses[-1])

    def _interrupt(self) -> None:
        name = signal.Signals(self.stop_signal).name
        where = " (its evaluation was cut short)" if self.loop.evals.missing else ""
        self._finish("interrupted", f"{name} at step {self.step}{where}; resume with trainer.resume=true")
        raise Interrupted(name)

    def save_checkpoint(self) -> None:
        """This step's checkpoint (train/ckpt_writer.py, which counts the time it holds training up in ``ckpt_s``)."""
        self.loop.meter.sync()  # the steps' queued work is the window's, not the checkpoint's (ckpt_s)
        self.loop.writer.save(self.loop.state, self.step)
        self.loop.ckpts.saved()

    def _finish(self, status: str, reason: str | None) -> dict:
        """The run's end: the checkpoint in flight is committed first, so the final summary is the last word."""
        self.loop.writer.wait()
        return self.loop.recorder.finish(status, reason)

    def write_summary(self) -> None:
        if self.loop is not None:
            with contextlib.suppress(Exception):  # an error path: the run's own error is the one to report
                self.loop.writer.wait()
            self.recorder.write_summary()

    def close(self, exit_code: int = 0) -> None:
        if self.loop is not None:  # setup may have failed in between: keep its error
            with contextlib.ExitStack() as later:  # the metrics and W&B are closed even if the last write failed
                later.callback(self.recorder.close, exit_code)
                self.loop.writer.close()


def run(cfg, run_dir: Path, callbacks: Sequence[Callback] = ()) -> dict:
    """Train one run into ``run_dir``; returns the summary. Raises ConfigError on bad input. ``callbacks``:
    :class:`~normbench.train.callbacks.Callback` s run after the trainer's own (diagnostics, validation)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    dist_utils.export_submitit_env()  # a multi-task submitit (SLURM) job: DDP across its tasks
    rank = dist_utils.rank()
    builder.setup_logging(run_dir, rank)
    if rank == 0:
        log.info("run directory: %s", run_dir.resolve())
    lock = RunLock(run_dir, resume=bool(cfg.trainer.resume))
    if rank == 0:
        lock.acquire()
    trainer = Trainer(cfg, run_dir, callbacks)
    # stop signals (normbench.train.signals): the step in progress ends, then checkpoint and `interrupted`
    on_stop = lambda signum: setattr(trainer, "stop_signal", signum)
    signals = RunSignals(cfg.trainer.stop_grace_s, on_stop, lambda signum, why: last_words(trainer, lock, signum, why))
    trainer.stop_signal = signals.caught
    exit_code = 1
    try:
        trainer.setup()
        summary = trainer.fit()
        exit_code = 0
        return summary
    except ConfigError:
        raise
    except Interrupted:
        exit_code = 128 + (trainer.stop_signal or signal.SIGTERM)
        if handler := signals.launcher_handler(trainer.stop_signal):
            hand_on(trainer, handler)
        raise
    except BaseException as exc:
        if trainer.summary:
            reason = f"{type(exc).__name__}: {first_line(exc)}"[:300]
            # KeyboardInterrupt: a second signal; SystemExit: e.g. submitit's preemption handler (it requeues)
            stopped = isinstance(exc, (KeyboardInterrupt, SystemExit))
            trainer.summary.update(status="interrupted" if stopped else "failed", reason=reason)
            trainer.write_summary()
        raise
    finally:
        trainer.close(exit_code)
        signals.quiet()
        lock.release()  # before the run stops listening: a signal from then on leaves at once (signals.py)
        signals.close()
        if rank == 0:
            log.info("run directory: %s", run_dir.resolve())
        dist_utils.shutdown(wait=exit_code == 0)  # torchrun: destroy the process group (no-op in one process)
