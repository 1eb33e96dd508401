"""What a run reports: ``metrics.jsonl`` records, W&B, the console line and ``summary.json``.

The trainer hands over each log step's record (:meth:`Recorder.log`) and the run's end
(:meth:`Recorder.finish`); the keys of records and summary are docs/contract.md §4 and §5.
Rank 0 writes; the other ranks keep the summary in memory only (it goes into checkpoints).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import socket

from normbench.config.spec import spec_of
from normbench.diag import outcomes
from normbench.diag.wandb_logger import WandbLogger
from normbench.run.provenance import code_commit
from normbench.runtime.flops import mfu, peak_memory_gb
from normbench.runtime.precision import attn_fp32_active
from normbench.runtime.throughput import SPENT, Eta, fmt, fmt_time

log = logging.getLogger("normbench")

KEPT_ON_RESUME = (
    "final_loss",
    "final_val_loss",
    "best_val_loss",
    "tokens_per_s",
    "step_time_s",
    "mfu",
    "wall_s",
    *SPENT,
)


class Recorder:
    def __init__(self, cfg, rundir, components, state, meter, resumed: bool):
        self.cfg, self.rundir, self.c, self.state, self.meter = cfg, rundir, components, state, meter
        self.is_main, self.world = state.rank == 0, state.world
        self.summary = state.summary  # one dict: the checkpoint carries it
        self.eta = Eta()
        self.loss_step: int | None = None  # the step of the summary's final_loss
        if self.is_main:
            self.metrics = rundir.metrics_writer(resume_step=state.step if resumed else 0)
            self.history = outcomes.History(self.metrics.kept)  # the run's end reads it, not metrics.jsonl
            self.wandb = WandbLogger(cfg, rundir.path, resume_id=state.wandb_id)
            state.wandb_id = self.wandb.run_id

    def start(self) -> None:
        """The summary says ``running`` from here on (a killed process leaves it so); a resumed run
        keeps its final numbers until it has new ones."""
        cfg, c, s = self.cfg, self.c, self.state
        spec = spec_of(cfg)
        self.summary.update(
            status="running",
            reason=None,
            **self._progress(),
            final_loss=None,
            tokens_per_s=None,
            step_time_s=None,
            mfu=None,  # null without a known peak (CPU, unknown GPU: set peak_flops=)
            peak_mem_gb=None,
            flops_per_token=c.flops_per_token,
            peak_flops=c.peak_flops,
            wall_s=0.0,
            **dict.fromkeys(SPENT, 0.0),  # eval_s, ckpt_s, diag_s (runtime/throughput.py)
            n_params=c.n_params,
            length_params=c.length.length_params,
            init_std=c.length.init_std,
            lr=spec.lr,  # optim.lr's number (auto resolved once: config/spec.py)
            lr_source=spec.lr_source,
            spec=dataclasses.asdict(spec),  # the run's resolved spec (config/spec.py)
            lr_resolved=spec.kind_lrs,  # {parameter kind: peak LR}, muP's multipliers applied (the spec's)
            arch=cfg.arch.name,
            norm=cfg.norm.name,
            optim=cfg.optim.name,
            seed=cfg.seed,
            device=c.device.type,
            precision=spec.precision,  # precision=auto resolved (config/spec.py)
            attn_fp32=attn_fp32_active(cfg),  # the SDPA kernel in fp32 under autocast
            compiled=c.compiled,
            max_steps=c.length.max_steps,
            host=socket.gethostname(),
            world_size=self.world,
            commit=code_commit(),  # the code that ran (run/provenance.py); the report's setup box shows it
        )
        if hasattr(c.data.train, "describe"):  # data=mix: its sources, weights and tokens (data/pipeline/mix.py)
            self.summary["data_mix"] = c.data.train.describe()
        self.summary.update({k: s.resumed_summary[k] for k in KEPT_ON_RESUME if k in s.resumed_summary})
        self.write_summary()

    def step_record(self, loss: float, lr: float, grad_norm: float, tps: float, step_time: float) -> dict:
        """A log step's own values (docs/contract.md §4), before the loop's and its callbacks' additions."""
        c, s = self.c, self.state
        return {
            "step": s.step,
            "tokens": s.tokens,
            "loss": loss,
            "lr": lr,
            "grad_norm": grad_norm,
            "tokens_per_s": tps,
            "time_s": self.meter.wall(),
            "step_time_s": step_time,
            "mfu": mfu(c.flops_per_token, tps, c.peak_flops, self.world),
            "peak_mem_gb": peak_memory_gb(c.device),
        }

    def log(self, record: dict, tps: float) -> None:
        """One log step: its record, the console line, and the summary's running numbers."""
        self.loss_step = record["step"]
        if self.is_main:
            self.metrics.write(record)
            self.history.add(record)
            self.wandb.log(record)
            c = self.c
            remaining = self.eta.remaining(record["step"], c.length.max_steps, c.tokens_per_step / max(tps, 1e-9))
            val = f" | val {record['val_loss']:.4f}" if "val_loss" in record else ""
            log.info(
                "step %d/%d | loss %.4f%s | lr %.2e | grad %.3f | %s tok/s | ETA %s",
                *(record["step"], c.length.max_steps, record["loss"], val, record["lr"], record["grad_norm"]),
                *(f"{tps:,.0f}", fmt_time(remaining)),
            )
        self._update(record["loss"])

    def final_loss(self, loss: float) -> None:
        """The loss of a step that was not logged (a checkpoint between log steps)."""
        s = self.state
        self.summary.update(final_loss=loss, step=s.step, tokens=s.tokens)
        self.loss_step = s.step

    def amend_val(self, val: float) -> None:
        """The val loss of an evaluation a signal cut short, added on resume to its step's record."""
        s = self.state
        if self.is_main:
            self.metrics.amend(s.step, {"val_loss": val})
            self.wandb.log({"step": s.step, "val_loss": val})
        self.summary.update(final_val_loss=val, best_val_loss=s.evals.best)
        self.write_summary()

    def _progress(self) -> dict:
        """The summary's fields that follow the training state, at start and at every log step."""
        s = self.state
        return dict(
            step=s.step,
            tokens=s.tokens,
            tokens_per_param=round(s.tokens / self.c.length.length_params, 4),
            final_val_loss=s.evals.last,
            best_val_loss=s.evals.best if math.isfinite(s.evals.best) else None,
            spikes=s.losses.spike.count,
            skipped_steps=s.skipped,
            amp_skipped_steps=s.amp_skipped,
        )

    def _update(self, loss: float) -> None:
        c, clock = self.c, self.meter.clock
        tps, step_time = self.meter.steady()
        steady_tps = clock["train_tokens"] / max(clock["train_time"], 1e-9)
        self.summary.update(
            **self._progress(),
            final_loss=loss,
            tokens_per_s=tps,
            step_time_s=step_time,
            mfu=mfu(c.flops_per_token, steady_tps, c.peak_flops, self.world),
            peak_mem_gb=peak_memory_gb(c.device),
            wall_s=self.meter.wall(),
            **self._spent(),
        )

    def _spent(self) -> dict:
        """eval_s, ckpt_s, diag_s: where the wall clock went besides the steps (runtime/throughput.py)."""
        return {k: round(self.meter.clock[k], 3) for k in SPENT}

    def finish(self, status: str, reason: str | None) -> dict:
        """The run's end: status, outcome (learned/unstable/stuck/diverged), per-layer statistics."""
        s = self.state
        self.summary.update(
            status=status,
            reason=reason,
            step=s.step,
            tokens=s.tokens,
            tokens_per_param=round(s.tokens / self.c.length.length_params, 4),
            **self._spent(),
        )
        if self.is_main:
            baseline = outcomes.baseline_loss(self.c.data)
            self.summary.update(outcomes.run_results(self.summary, self.history, baseline, s.losses.spike.steps))
        self.write_summary()
        if status == "diverged":
            log.warning("run diverged: %s", reason)
        else:
            log.info(
                "run %s at step %d: final loss %s (step %s), best val loss %s, %s tok/s",
                *(status, s.step, fmt(self.summary["final_loss"]), self.loss_step or s.step),
                *(fmt(self.summary["best_val_loss"]), fmt(self.summary["tokens_per_s"], ".0f")),
            )
        return self.summary

    def write_summary(self) -> None:
        if self.is_main:
            self.rundir.write_summary(self.summary)

    def close(self, exit_code: int = 0) -> None:
        if self.is_main and hasattr(self, "metrics"):
            self.metrics.close()
        if self.is_main and hasattr(self, "wandb"):  # setup may have failed in between: keep its error
            self.wandb.finish(exit_code)
