"""The training loop: causal-LM pretraining with the run directory of docs/contract.md §3.

Laid out as torchtitan's trainer: :func:`normbench.train.build.build` makes the components,
:class:`normbench.train.state.TrainState` is what a checkpoint holds, :class:`normbench.train.throughput.
Throughput` times the steps, and :meth:`Trainer.fit` is the algorithm: set the LR, forward/backward
over micro-batches, clip, step, re-normalize (nGPT), log, evaluate, checkpoint, stop on a signal.

Determinism: on CPU the same seed gives the same losses to the last bit, and a resumed run
continues exactly (the schedule is a pure function of the step; everything else is in the state).

Extension points (tests use them, as may plugins named by ``NORMBENCH_PLUGINS``, cli/__init__.py):
:meth:`Trainer.forward_backward` (one step's gradients), :meth:`Trainer.eval_loss` (one
validation batch), :meth:`Trainer.optimizer_step`, :meth:`Trainer.save_checkpoint`.
"""

from __future__ import annotations

import logging
import math
import signal
import time
from pathlib import Path

import torch

from normbench.errors import ConfigError, first_line
from normbench.run.lock import RunLock
from normbench.run.rundir import RunDir
from normbench.train import build as builder
from normbench.train import checkpoint as ckpt
from normbench.train import distributed as dist_utils
from normbench.train.diagnostics import SpikeDetector
from normbench.train.flops import mfu, peak_memory_gb
from normbench.train.optim import lr_factor, set_lr
from normbench.train.recorder import Recorder
from normbench.train.signals import STOP, preemption_signals
from normbench.train.state import TrainState
from normbench.train.throughput import Throughput
from normbench.train.validation import prepare

log = logging.getLogger("normbench")


class Interrupted(Exception):
    pass


class Trainer:
    def __init__(self, cfg, run_dir: Path):
        self.cfg, self.run_dir, self.rundir = cfg, Path(run_dir), RunDir(run_dir)
        self.rank, self.world = dist_utils.rank(), dist_utils.world_size()
        self.is_main = self.rank == 0
        self.stop_signal: int | None = None
        self.stop_votes: torch.Tensor | None = None  # torchrun: ranks that caught a stop signal, this step
        self.summary: dict = {}
        self.state: TrainState | None = None

    @property
    def step(self) -> int:
        return self.state.step if self.state is not None else 0

    # ------------------------------------------------------------------ setup
    def setup(self) -> None:
        self.cfg, notes = prepare(self.cfg)  # typed and validated, once (validation.validate)
        cfg = self.cfg
        c = builder.build(cfg, self.rank, self.world, notes)
        self.__dict__.update(vars(c))  # device, model, raw_model, optimizer, batches, diag, t, sched, ...
        self.meter = Throughput(self.tokens_per_step, self.device)
        spike = SpikeDetector(cfg.diag.spike_factor, cfg.diag.spike_window)
        self.state = TrainState(cfg, c, self.meter, spike, self.summary)
        resumed = self.state.resume(self.rundir.checkpoint_path, cfg, self.max_steps, self.sched)
        self.recorder = Recorder(cfg, self.rundir, c, self.state, self.meter, resumed)
        self.recorder.start()

    # ------------------------------------------------------------------- loop
    def fit(self) -> dict:
        s, t = self.state, self.t
        self.meter.start(s.step)  # wall clock and steady-state throughput go on across a resume
        self.pending: list[torch.Tensor] = []  # per-step losses on device, synced at log steps
        self.prev_votes = None  # torchrun, CUDA: the previous step's stop votes
        if s.eval_missing:  # interrupted during this step's evaluation: do it now, into its record
            self._finish_eval()
        log.info(
            "training %d steps (%s tokens/step, %d already done) on %s, precision %s",
            *(self.max_steps, f"{self.tokens_per_step:,}", s.step, self.device, self.cfg.precision),
        )
        self.model.train()
        while s.step < self.max_steps:
            self.meter.step_start(s.step)
            lr = set_lr(self.optimizer, lr_factor(s.step, self.max_steps, self.sched))
            diag_now = self._diag_due(s.step)
            loss, grad_norm = self.train_step(diag_now)
            if diag_now:
                self.diag.before_step()
            self.optimizer_step(grad_norm)
            if diag_now:
                self.diag.after_step()
            self.pending.append(loss)
            s.step, s.tokens = s.step + 1, s.tokens + self.tokens_per_step
            eval_now = s.step % t.eval_every == 0 or s.step in (1, self.max_steps)
            ckpt_now = s.step % t.ckpt_every == 0 and s.step < self.max_steps
            log_now = s.step % t.log_every == 0 or s.step == self.max_steps or diag_now or eval_now
            self.meter.step_end(sync=log_now)
            if log_now and (status := self.log_step(lr, grad_norm, diag_now, eval_now)):
                return self.recorder.finish("diverged", status)
            stop_now = self._stop_requested()
            if stop_now or ckpt_now:
                if status := self._flush_losses():
                    return self.recorder.finish("diverged", status)
                self.save_checkpoint()
            if stop_now:  # also during the last step or its evaluation: the resume finishes the run
                self._interrupt()
        self.save_checkpoint()
        return self.recorder.finish("completed", None)

    def _diag_due(self, step: int) -> bool:
        """The first step, every diag.every steps done (records at step 1, every, 2*every, ...) and the
        last step (depth plots and per-layer statistics show the end of training)."""
        every = self.cfg.diag.every
        return self.diag.enabled and (step == 0 or (step + 1) % every == 0 or step + 1 == self.max_steps)

    # ------------------------------------------------------------------ steps
    def train_step(self, diag_now: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Gradients of one global batch; returns (mean loss over all ranks, grad norm before clipping)."""
        micro_batches = self.batches.global_step(self.t.grad_accum, self.rank, self.world)
        loss_sum = self.forward_backward(micro_batches)
        scale = 1.0 / self.t.grad_accum
        if self.world > 1:  # one collective: the global loss, and how many ranks caught a stop signal
            vote = torch.full((), float(self.stop_signal is not None), device=self.device)
            reduced = dist_utils.all_reduce_sum(torch.stack([loss_sum, vote]))
            loss_mean, self.stop_votes = reduced[0] * scale, reduced[1]
        else:
            loss_mean = loss_sum * scale
        if self.scaler is not None:
            for opt in self.optimizer.optimizers:
                self.scaler.unscale_(opt)
        if diag_now:
            self.diag.grad_norms()  # before clipping, as docs/contract.md §4 defines them
        clip = self.t.grad_clip if self.t.grad_clip > 0 else math.inf
        grad_norm = dist_utils.clip_grad_norm_(self.raw_model.parameters(), clip)  # total over FSDP shards too
        return loss_mean, grad_norm

    def forward_backward(self, micro_batches: list) -> torch.Tensor:
        """Accumulate this rank's gradients over its micro-batches; returns the sum of their losses."""
        loss_sum = torch.zeros((), device=self.device)
        # this rank's mean; DDP/FSDP average over ranks, so the gradient is the global-batch mean
        grad_scale = 1.0 / len(micro_batches)
        for i, (x, y) in enumerate(micro_batches):
            with dist_utils.maybe_no_sync(self.model, i == len(micro_batches) - 1), self.autocast():
                _, loss = self.model(x, y)
            loss_for_grad = loss * grad_scale
            if self.scaler is not None:
                loss_for_grad = self.scaler.scale(loss_for_grad)
            loss_for_grad.backward()
            loss_sum += loss.detach()
        return loss_sum

    def optimizer_step(self, grad_norm: torch.Tensor) -> bool:
        """Step the optimizer; returns whether it stepped.

        fp16: GradScaler skips a step whose gradients overflowed and halves the loss scale, a
        routine event counted in ``amp_skipped`` (never toward ``trainer.max_skipped``; a real
        divergence shows in the loss). Otherwise, with ``trainer.skip_nonfinite``, a step with
        non-finite gradients is skipped and counted in ``skipped``.
        """
        s = self.state
        if self.scaler is not None:
            scale = self.scaler.get_scale()
            for opt in self.optimizer.optimizers:
                self.scaler.step(opt)
            self.scaler.update()
            stepped = self.scaler.get_scale() >= scale  # lowered: the scaler skipped this step
            s.amp_skipped += not stepped
        elif self.t.skip_nonfinite and not torch.isfinite(grad_norm).item():
            stepped = False
            s.skipped += 1
        else:
            self.optimizer.step()
            stepped = True
        if stepped:
            self.raw_model.after_step()  # nGPT re-normalization: outside any compiled graph
        if self.qk_clip is not None:  # every step (a skipped one only resets), so DDP ranks stay in step
            self.qk_clip.step(apply=stepped)
        self.optimizer.zero_grad(set_to_none=True)
        return stepped

    @torch.no_grad()
    def evaluate(self) -> float | None:
        """Mean validation loss; None when a stop signal cut it short (one process: under torchrun
        every rank must run the same batches, so there only the grace deadline stops it)."""
        self.model.eval()
        total = torch.zeros((), device=self.device)
        for batch in self.val_batches:
            if self.stop_signal is not None and self.world == 1:
                self.model.train()
                return None
            total += self.eval_loss(batch)
        self.model.train()
        return (total / len(self.val_batches)).item()

    def eval_loss(self, batch: torch.Tensor) -> torch.Tensor:
        batch = batch.to(self.device)
        with self.autocast():
            _, loss = self.model(batch[:, :-1], batch[:, 1:])
        return loss.float()

    # --------------------------------------------------------- log, stop, checkpoint
    def log_step(self, lr: float, grad_norm: torch.Tensor, diag_now: bool, eval_now: bool) -> str | None:
        """The record of a log step (losses synced, diagnostics, evaluation); a divergence's reason or None."""
        s = self.state
        losses = torch.stack(self.pending).tolist()
        self.pending.clear()
        status = self._check_losses(losses)
        tps, step_time = self.meter.window()
        record = {
            "step": s.step,
            "tokens": s.tokens,
            "loss": losses[-1],
            "lr": lr,
            "grad_norm": grad_norm.item(),
            "tokens_per_s": tps,
            "time_s": self.meter.wall(),
            "step_time_s": step_time,
            "mfu": mfu(self.flops_per_token, tps, self.peak_flops, self.world),
            "peak_mem_gb": peak_memory_gb(self.device),
            "spikes": s.spike.count,  # loss spikes so far (diagnostics.SpikeDetector)
        }
        record.update(self.qk_clip.metrics() if self.qk_clip is not None else {})
        if spike_steps := s.spike.pop_steps():
            record["spike_steps"] = spike_steps
        if diag_now:  # the diagnostic forward is training-time cost: counted in tokens/s
            t_diag = time.perf_counter()
            record.update(self.diag.collect())
            self.meter.add(time.perf_counter() - t_diag)
        if eval_now and status is None:
            val = self.evaluate()
            s.eval_missing = val is None
            if val is not None:
                record["val_loss"] = s.last_val = val
                s.best_val = min(s.best_val, s.last_val)
        self.recorder.log(record, tps)
        return status

    def _stop_requested(self) -> bool:
        if self.world == 1:
            stop_now = self.stop_signal is not None
        else:
            # every rank reads the same vote (summed with the loss): on CPU this step's; on CUDA the
            # previous step's, so the host never waits for the step it has just queued
            votes = self.stop_votes if self.device.type != "cuda" else self.prev_votes
            self.prev_votes = self.stop_votes
            stop_now = votes is not None and votes.item() > 0
            if stop_now:  # which signal: the largest number any rank caught
                self.stop_signal = dist_utils.any_rank_max(self.stop_signal or 0, self.device) or signal.SIGTERM
        if stop_now:
            STOP.safe_point()  # checkpoint and summary from here: the watchdog's deadline is off
        return stop_now

    def _flush_losses(self) -> str | None:
        """Before a checkpoint, the losses since the last log step get a log step's bookkeeping, so the
        checkpoint takes the spike/divergence state and a resume continues it exactly."""
        if not self.pending:
            return None
        losses = torch.stack(self.pending).tolist()
        self.pending.clear()
        if status := self._check_losses(losses):
            return status
        self.recorder.final_loss(losses[-1])
        return None

    def _interrupt(self) -> None:
        name = signal.Signals(self.stop_signal).name
        where = " (its evaluation was cut short)" if self.state.eval_missing else ""
        self.recorder.finish("interrupted", f"{name} at step {self.step}{where}; resume with trainer.resume=true")
        raise Interrupted(name)

    def _finish_eval(self) -> None:
        """The evaluation a signal cut short at the checkpoint's step, done on resume: its val loss
        goes into that step's record, as in an uninterrupted run (evaluation draws no random numbers)."""
        val, s = self.evaluate(), self.state
        if val is None:
            return
        s.last_val, s.best_val, s.eval_missing = val, min(s.best_val, val), False
        self.recorder.amend_val(val)

    def _check_losses(self, losses: list[float]) -> str | None:
        """Divergence and spike bookkeeping over the losses since the last log step."""
        t, s = self.t, self.state
        for step, loss in enumerate(losses, s.step - len(losses) + 1):  # step numbers as in the records
            if not math.isfinite(loss):
                return f"non-finite loss ({loss}) at step {step}"
            if s.initial_loss is None:
                s.initial_loss = loss
            if loss > t.diverge_factor * s.initial_loss:
                return f"loss {loss:.3f} > {t.diverge_factor} x initial loss {s.initial_loss:.3f}"
            s.spike.update(loss, step)
        if s.skipped > t.max_skipped:
            return f"{s.skipped} optimizer steps skipped for non-finite gradients"
        return None

    def save_checkpoint(self) -> None:
        state = self.state.state_dict()  # collective under FSDP: every rank gets here; rank 0 writes
        if state is not None:
            ckpt.save_atomic(state, self.rundir.checkpoint_path)
            self.write_summary()

    def write_summary(self) -> None:
        if hasattr(self, "recorder"):
            self.recorder.write_summary()

    def close(self, exit_code: int = 0) -> None:
        if hasattr(self, "recorder"):  # setup may have failed in between: keep its error
            self.recorder.close(exit_code)


def run(cfg, run_dir: Path) -> dict:
    """Train one run into ``run_dir``; returns the summary. Raises ConfigError on bad input."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    dist_utils.export_submitit_env()  # a multi-task submitit (SLURM) job: DDP across its tasks
    rank = dist_utils.rank()
    builder.setup_logging(run_dir, rank)
    if rank == 0:
        log.info("run directory: %s", run_dir.resolve())
    lock = RunLock(run_dir)
    if rank == 0:
        lock.acquire()
    trainer = Trainer(cfg, run_dir)
    # stop signals (normbench.train.signals): the step in progress ends, then checkpoint and `interrupted`.
    # The preemption signal is only chained in front of a Python handler that wants it (submitit's requeue)
    preempt = preemption_signals()
    installed = STOP.install([signal.SIGTERM, signal.SIGINT, *(s for s in preempt if callable(signal.getsignal(s)))])
    STOP.grace_s = cfg.trainer.stop_grace_s
    trainer.stop_signal = STOP.signum  # a signal before this job (a sweep stops at the next safe point)
    on_stop = lambda signum: setattr(trainer, "stop_signal", signum)  # noqa: E731
    STOP.on_stop.append(on_stop)
    STOP.last_words = lambda signum, why: _last_words(trainer, lock, signum, why)
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
        previous = STOP.previous(trainer.stop_signal)
        if trainer.stop_signal in preempt and callable(previous):
            log.info("checkpoint written; %s goes on to the launcher", signal.Signals(trainer.stop_signal).name)
            try:
                previous(trainer.stop_signal, None)  # submitit: requeue this job (which then resumes), exit
            except Exception as exc:  # submitit: not requeued (e.g. timed out too often); the checkpoint is fine
                why = first_line(exc, type(exc).__name__)
                trainer.summary["reason"] = f"{trainer.summary.get('reason')}; not requeued: {why}"[:300]
                trainer.write_summary()
                raise
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
        STOP.last_words = None
        lock.release()  # before the run stops listening: a signal from then on leaves at once (signals.py)
        STOP.on_stop.remove(on_stop)
        STOP.uninstall(installed)
        if rank == 0:
            log.info("run directory: %s", run_dir.resolve())
        dist_utils.shutdown(wait=exit_code == 0)  # torchrun: destroy the process group (no-op in one process)


def _last_words(trainer: Trainer, lock: RunLock, signum: int, why: str) -> None:
    """The watchdog ends the process at once (normbench.train.signals): the summary says so first."""
    name = signal.Signals(signum).name
    log.warning("%s: %s: stopping at once at step %d; the last checkpoint is kept", name, why, trainer.step)
    if trainer.summary and trainer.is_main:
        reason = f"{name} at step {trainer.step} ({why}): stopped at once; resume with trainer.resume=true"
        summary = {**trainer.summary, "status": "interrupted", "reason": reason}
        trainer.rundir.write_summary_now(summary)
    lock.release()
