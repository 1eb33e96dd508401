"""The training loop: causal-LM pretraining with the run directory of docs/contract.md §3.

Reads like the algorithm (torchtitan / nanoGPT train.py): sample a global batch,
forward/backward over micro-batches, clip, step, re-normalize (nGPT), log,
evaluate, checkpoint. Components live in their own modules: data, model,
optim, checkpoint, metrics, diagnostics.

Determinism: on CPU the same seed gives the same losses to the last bit, and a
resumed run continues exactly (model, optimizer, RNG and sampler states are all
in ``last.pt``; the schedule is a pure function of the step).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import socket
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from omegaconf import OmegaConf

from normbench import checkpoint as ckpt
from normbench import distributed as dist_utils
from normbench import memory, metrics, outcomes
from normbench.config import run_steps, validate
from normbench.data import load_data
from normbench.diagnostics import Diagnostics, SpikeDetector
from normbench.errors import ConfigError, first_line
from normbench.flops import mfu, model_flops_per_token, peak_flops, peak_memory_gb
from normbench.metrics import JsonlWriter, write_json_atomic
from normbench.model import build_model, check_combination, padded_vocab
from normbench.optim import build_optimizer, lr_factor, set_lr
from normbench.rundir import RunLock, check_resume_config, flat_config
from normbench.signals import STOP, preemption_signals, write_json_now
from normbench.stabilizers import QKClip
from normbench.wandb_logger import WandbLogger

log = logging.getLogger("normbench")


class Interrupted(Exception):
    pass


def setup_logging(run_dir: Path, rank: int) -> None:
    root = logging.getLogger("normbench")
    root.setLevel(logging.INFO)
    root.propagate = False
    for h in list(root.handlers):
        root.removeHandler(h)
        h.close()
    if rank != 0:
        return
    fmt = logging.Formatter("[%(asctime)s] %(message)s", datefmt="%H:%M:%S")
    console = logging.StreamHandler(sys.stdout)
    console.setFormatter(fmt)
    file = logging.FileHandler(run_dir / "train.log")
    file.setFormatter(fmt)
    root.addHandler(console)
    root.addHandler(file)


def resolve_device(cfg) -> torch.device:
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device=cuda but no CUDA GPU is available here; use device=cpu or device=auto")
    if cfg.device == "cpu" or (cfg.device == "auto" and not torch.cuda.is_available()):
        device = torch.device("cpu")
    else:
        device = torch.device("cuda", dist_utils.local_rank() % torch.cuda.device_count())  # 1 GPU/task: cuda:0
    if cfg.precision == "fp16" and device.type == "cpu":
        raise ConfigError("precision=fp16 needs a CUDA GPU (GradScaler); on CPU use precision=fp32 or bf16")
    return device


class Batches:
    """Random windows of a token array; one generator drives the whole global batch.

    Every rank draws the same global batch of ``batch_size * grad_accum`` windows
    and keeps its own micro-batches, so N processes see exactly what one
    process with the same global batch would.
    """

    def __init__(self, tokens: np.ndarray, batch_size: int, seq_len: int, seed: int, device):
        self.tokens, self.batch_size, self.seq_len, self.device = tokens, batch_size, seq_len, device
        self.gen = torch.Generator().manual_seed(seed)
        self.arange = np.arange(seq_len + 1)

    def starts(self, n: int) -> np.ndarray:
        return torch.randint(len(self.tokens) - self.seq_len - 1, (n,), generator=self.gen).numpy()

    def gather(self, starts: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(self.tokens[starts[:, None] + self.arange].astype(np.int64))

    def windows(self, n: int) -> torch.Tensor:
        return self.gather(self.starts(n))

    def global_step(self, grad_accum: int, rank: int, world: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        # draw the whole global batch's offsets (cheap), read only this rank's windows
        starts = self.starts(self.batch_size * grad_accum).reshape(grad_accum, self.batch_size)
        out = []
        for micro in range(rank, grad_accum, world):
            chunk = self.gather(starts[micro])
            if self.device.type == "cuda":
                chunk = chunk.pin_memory().to(self.device, non_blocking=True)
            out.append((chunk[:, :-1], chunk[:, 1:]))
        return out


def plain(node) -> SimpleNamespace:
    """A config section as a plain namespace (attribute reads without OmegaConf's overhead)."""
    return SimpleNamespace(**OmegaConf.to_container(node, resolve=True))


def fixed_batches(tokens: np.ndarray, n: int, batch_size: int, seq_len: int, seed: int) -> list[torch.Tensor]:
    """Deterministic windows, the same for every run (validation, diagnostics)."""
    b = Batches(tokens, batch_size, seq_len, seed, torch.device("cpu"))
    return [b.windows(batch_size) for _ in range(n)]


class Trainer:
    def __init__(self, cfg, run_dir: Path):
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.rank, self.world = dist_utils.rank(), dist_utils.world_size()
        self.is_main = self.rank == 0
        self.stop_signal: int | None = None
        self.stop_votes: torch.Tensor | None = None  # torchrun: ranks that caught a stop signal, this step
        self.summary: dict = {}

    # ------------------------------------------------------------------ setup
    def setup(self) -> None:
        cfg, t = self.cfg, self.cfg.trainer
        validate(cfg)
        notes = check_combination(cfg)
        self.device = resolve_device(cfg)
        if t.grad_accum % self.world:
            raise ConfigError(
                f"trainer.grad_accum={t.grad_accum} must be a multiple of the world size ({self.world}) "
                f"so the global batch stays what the config says (e.g. trainer.grad_accum="
                f"{self.world * -(-t.grad_accum // self.world)})"
            )
        dist_utils.check_config(cfg)  # e.g. optimizers that FSDP2 shards cannot run
        torch.manual_seed(cfg.seed)
        for note in notes:
            log.info("note: %s", note)
        self.data = load_data(cfg.data, log=log.info)
        T = cfg.model.seq_len
        if len(self.data.val) <= T + 1:
            raise ConfigError(
                f"model.seq_len={T} is longer than the validation split ({len(self.data.val)} tokens); "
                "lower model.seq_len or raise data.val_fraction"
            )
        self.vocab = padded_vocab(cfg, self.data.vocab_size)
        memory.check(cfg, self.vocab, self.device, log=log.info, world=self.world)  # refuse what cannot fit
        self.raw_model = build_model(cfg, self.vocab).to(self.device)
        self.n_params = self.raw_model.num_params()
        log.info(
            "model: arch=%s norm=%s  %d layers, d_model %d, %d heads, seq %d, vocab %d  ->  %s params",
            cfg.arch.name,
            cfg.norm.name,
            cfg.model.n_layer,
            cfg.model.d_model,
            cfg.model.n_head,
            T,
            self.vocab,
            f"{self.n_params:,}",
        )
        self.flops_per_token = model_flops_per_token(self.raw_model, cfg.model)
        self.peak_flops = peak_flops(self.device, cfg.peak_flops)
        # DDP / FSDP2 (raw_model sharded in place) / torch.compile: distributed.wrap_model
        self.model = dist_utils.wrap_model(self.raw_model, cfg, self.device, log=log.info)
        if self.world > 1:
            torch.manual_seed(cfg.seed + 1_000_003 * self.rank)  # dropout differs per rank; init did not
        self.optimizer = build_optimizer(self.raw_model, cfg, log=log.info)
        self.qk_clip = QKClip.from_config(cfg, self.raw_model)  # None unless optim.qk_clip=true
        self.scaler = self._make_scaler()
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.precision)
        self.autocast = (lambda: torch.autocast(self.device.type, dtype=dtype)) if dtype else contextlib.nullcontext
        # plain copies of what the step loop reads: an OmegaConf attribute read costs microseconds
        self.t, self.sched = plain(cfg.trainer), plain(cfg.sched)
        if cfg.arch.name == "ngpt":
            self.sched.warmup_steps = 0  # nGPT's recipe (check_combination notes an override)
        self.diag_every = cfg.diag.every
        self.batches = Batches(self.data.train, t.batch_size, T, cfg.seed, self.device)
        self.val_batches = fixed_batches(self.data.val, t.eval_batches, t.batch_size, T, seed=1234)
        self.tokens_per_step = t.batch_size * t.grad_accum * T
        self.max_steps = run_steps(cfg)
        self.diag = Diagnostics(cfg.diag, self.raw_model, fixed_batches(self.data.val, 1, cfg.diag.batch, T, 4321)[0])
        if self.diag.enabled and dist_utils.effective_parallel(cfg) == "fsdp":
            log.info("note: diagnostics are off under parallel=fsdp (they read sharded parameters); use parallel=ddp")
            self.diag.enabled = False

        # state that a checkpoint carries
        self.step, self.tokens, self.best_val, self.last_val = 0, 0, math.inf, None
        self.initial_loss: float | None = None
        self.eval_missing = False  # a signal cut this step's evaluation short: the resume does it
        self.skipped = 0  # non-finite steps skipped by trainer.skip_nonfinite (count toward max_skipped)
        self.amp_skipped = 0  # fp16: steps GradScaler skipped on overflow, lowering the scale (routine)
        self.spike = SpikeDetector(cfg.diag.spike_factor, cfg.diag.spike_window)  # checkpoint: spikes, recent_losses
        self.wandb_id: str | None = None
        self.resumed_summary: dict = {}  # the checkpoint's summary: a resumed run keeps its final numbers
        self.clock = {"wall_s": 0.0, "train_time": 0.0, "train_tokens": 0}  # continued across a resume
        # test hook: comma-separated steps whose gradients are made NaN (read once, not per step)
        self.nan_grad_steps = {int(v) for v in os.environ.get("NORMBENCH_TEST_NAN_GRAD", "").split(",") if v.strip()}
        self.slow_eval = float(os.environ.get("NORMBENCH_TEST_SLOW_EVAL") or 0)  # test hook: s per final val batch
        self.hang_step = int(os.environ.get("NORMBENCH_TEST_HANG_AT_STEP") or 0)  # test hook: a step that never ends
        self.start_wall = time.perf_counter()
        resumed = self._maybe_resume()
        if self.is_main:
            self.metrics = JsonlWriter(self.run_dir / "metrics.jsonl", resume_step=self.step if resumed else 0)
            self.wandb = WandbLogger(cfg, self.run_dir, resume_id=self.wandb_id)
            self.wandb_id = self.wandb.run_id
        self.summary = self._base_summary()
        kept = ("final_loss", "final_val_loss", "best_val_loss", "tokens_per_s", "step_time_s", "mfu", "wall_s")
        self.summary.update({k: self.resumed_summary[k] for k in kept if k in self.resumed_summary})
        self.write_summary()  # status "running" from here on (a killed process leaves it so)

    def _maybe_resume(self) -> bool:
        path = self.run_dir / "checkpoints" / "last.pt"
        if not self.cfg.trainer.resume:
            if path.exists() and self.is_main:  # a fresh run here: a later resume must not pick up the old one
                kept = path.with_name(f"replaced-{time.strftime('%Y%m%d-%H%M%S')}.pt")
                os.replace(path, kept)
                log.warning("trainer.resume=false: starting over; the old checkpoint is now %s", kept)
            return False
        if not path.exists():
            log.info("trainer.resume=true but no checkpoint at %s: starting from step 0", path)
            return False
        state = ckpt.load(path)
        old_cfg = state.get("config") if isinstance(state.get("config"), dict) else {}
        diff = check_resume_config(old_cfg, flat_config(self.cfg), list(self.cfg.trainer.resume_allow_changed), path)
        if not isinstance(state["step"], int) or state["step"] > self.max_steps:
            raise ConfigError(
                f"checkpoint {path} is at step {state['step']}, past trainer.max_steps={self.max_steps}; "
                "to train on, raise trainer.max_steps and add trainer.resume_allow_changed=[trainer.max_steps]"
            )
        self._warn_schedule_change(state, old_cfg)
        try:
            # full state dicts; re-sharded under FSDP
            dist_utils.load_full_state_dicts(self.raw_model, self.optimizer, state["model"], state["optimizer"])
        except (RuntimeError, KeyError, ValueError, TypeError, AttributeError) as exc:
            lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()] or [type(exc).__name__]
            why = next((ln for ln in lines if "mismatch" in ln or "key(s)" in ln), lines[0])  # state_dict details
            raise ConfigError(f"checkpoint {path} does not fit this model ({why[:200]})") from None
        self.resumed_summary = state.get("summary") if isinstance(state.get("summary"), dict) else {}
        self.step, self.tokens = state["step"], state["tokens"]
        if isinstance(state.get("clock"), dict):
            self.clock.update(state["clock"])
        self.best_val = state.get("best_val", math.inf)
        self.last_val = state.get("last_val")
        self.initial_loss = state.get("initial_loss")
        self.skipped = state.get("skipped", 0)
        self.amp_skipped = state.get("amp_skipped", 0)
        self.eval_missing = bool(state.get("eval_missing", False))
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])  # the loss scale and its growth counter go on
        self.spike.load_state_dict(state)
        self.spike.steps = list(state.get("spike_steps_unlogged", []))
        self.wandb_id = state.get("wandb_id")
        self.batches.gen.set_state(state["sampler_rng"])
        self._restore_rng(state)
        log.info("resumed from %s at step %d%s", path, self.step, f" (changed: {', '.join(diff)})" if diff else "")
        return True

    def _rng_state(self) -> dict:
        cuda = self.device.type == "cuda"
        return {"torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state(self.device) if cuda else None}

    def _restore_rng(self, state: dict) -> None:
        """The dropout RNG: each rank's own stream when the world size is the one that saved it.

        On another world size there is no stream to continue for some ranks: every rank then
        starts a fresh one from (seed, rank, step), so dropout masks (only they draw from it
        after init) differ from an uninterrupted run; without dropout nothing changes.
        """
        ranks = state.get("rank_rng")
        if isinstance(ranks, list) and len(ranks) == self.world:
            torch.set_rng_state(ranks[self.rank]["torch"])
            if self.device.type == "cuda" and ranks[self.rank].get("cuda") is not None:
                torch.cuda.set_rng_state(ranks[self.rank]["cuda"], self.device)
            return
        if self.world > 1:
            torch.manual_seed(self.cfg.seed + 1_000_003 * self.rank + 7919 * self.step)
            if self.cfg.model.dropout > 0:
                log.info("note: resumed on a new world size; dropout masks continue from a fresh per-rank stream")
            return
        torch.set_rng_state(state["torch_rng"])
        if torch.cuda.is_available() and state.get("cuda_rng") is not None:
            torch.cuda.set_rng_state_all(state["cuda_rng"])

    def _warn_schedule_change(self, state: dict, old_cfg: dict) -> None:
        """The LR schedule is a function of (step, max_steps): a new run length moves the LR at the resume step."""
        old_max = (state.get("summary") or {}).get("max_steps") or old_cfg.get("trainer.max_steps")
        step = state["step"]
        if not isinstance(old_max, int) or old_max == self.max_steps or step >= self.max_steps:
            return
        before = lr_factor(min(step, old_max - 1), old_max, self.sched)
        after = lr_factor(step, self.max_steps, self.sched)
        if abs(after - before) > 0.01 * max(before, after):
            log.warning(
                "run length changed %d -> %d steps: the LR at step %d moves from %.3g to %.3g x optim.lr "
                "(sched=%s is laid over the new length; sched=wsd extends smoothly while still in its stable phase)",
                old_max,
                self.max_steps,
                step,
                before,
                after,
                self.cfg.sched.name,
            )

    def _base_summary(self) -> dict:
        cfg = self.cfg
        return {
            "status": "running",
            "reason": None,
            "step": self.step,
            "tokens": self.tokens,
            "final_loss": None,
            "final_val_loss": self.last_val,
            "best_val_loss": self.best_val if math.isfinite(self.best_val) else None,
            "tokens_per_s": None,
            "step_time_s": None,
            "mfu": None,  # null without a known peak (CPU, unknown GPU: set peak_flops=)
            "peak_mem_gb": None,
            "flops_per_token": self.flops_per_token,
            "peak_flops": self.peak_flops,
            "wall_s": 0.0,
            "n_params": self.n_params,
            "arch": cfg.arch.name,
            "norm": cfg.norm.name,
            "optim": cfg.optim.name,
            "seed": cfg.seed,
            "device": self.device.type,
            "precision": cfg.precision,
            "spikes": self.spike.count,
            "skipped_steps": self.skipped,
            "amp_skipped_steps": self.amp_skipped,
            "max_steps": self.max_steps,
            "host": socket.gethostname(),
            "world_size": self.world,
        }

    # ------------------------------------------------------------- checkpoint
    def save_checkpoint(self) -> None:
        # one format for every world size and parallel mode: the full (unsharded) state dict.
        # Under FSDP the gather is collective, so every rank gets here; rank 0 writes.
        model_state, optim_state = dist_utils.full_state_dicts(self.raw_model, self.optimizer)
        rank_rng = dist_utils.gather_to_main(self._rng_state())  # dropout streams differ per rank
        if not self.is_main:
            return
        state = {
            "model": model_state,
            "optimizer": optim_state,
            "step": self.step,
            "tokens": self.tokens,
            "best_val": self.best_val,
            "last_val": self.last_val,
            "initial_loss": self.initial_loss,
            **self.spike.state_dict(),  # spikes, recent_losses
            "spike_steps_unlogged": list(self.spike.steps),  # found since the last record (interrupt mid-interval)
            "skipped": self.skipped,
            "amp_skipped": self.amp_skipped,
            "eval_missing": self.eval_missing,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "wandb_id": self.wandb_id,
            "summary": dict(self.summary),
            "clock": {**self.clock, "wall_s": time.perf_counter() - self.start_wall},
            "sampler_rng": self.batches.gen.get_state(),
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            "rank_rng": rank_rng,
            "config": flat_config(self.cfg),
        }
        ckpt.save_atomic(state, self.run_dir / "checkpoints" / "last.pt")
        self.write_summary()

    def write_summary(self) -> None:
        if self.is_main:
            write_json_atomic(self.summary, self.run_dir / "summary.json")

    # ------------------------------------------------------------------ steps
    def train_step(self, diag_now: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        micro_batches = self.batches.global_step(self.t.grad_accum, self.rank, self.world)
        loss_sum = torch.zeros((), device=self.device)
        scale = 1.0 / self.t.grad_accum
        # this rank's mean; DDP/FSDP average over ranks, so the gradient is the global-batch mean
        grad_scale = 1.0 / len(micro_batches)
        for i, (x, y) in enumerate(micro_batches):
            sync = i == len(micro_batches) - 1
            with dist_utils.maybe_no_sync(self.model, sync), self.autocast():
                _, loss = self.model(x, y)
            loss_for_grad = loss * grad_scale
            if self.scaler is not None:
                loss_for_grad = self.scaler.scale(loss_for_grad)
            loss_for_grad.backward()
            loss_sum += loss.detach()
        if self.step + 1 == self.hang_step:
            time.sleep(3600)
        if self.step + 1 in self.nan_grad_steps:  # test hook (NORMBENCH_TEST_NAN_GRAD): steps 1..
            next(p for p in self.raw_model.parameters() if p.grad is not None).grad.fill_(float("nan"))
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

    def optimizer_step(self, grad_norm: torch.Tensor) -> bool:
        """Step the optimizer; returns whether it stepped.

        fp16: GradScaler skips a step whose gradients overflowed and halves the loss scale, a
        routine event counted in ``amp_skipped`` (never toward ``trainer.max_skipped``; a real
        divergence shows in the loss). Otherwise, with ``trainer.skip_nonfinite``, a step with
        non-finite gradients is skipped and counted in ``skipped``.
        """
        if self.scaler is not None:
            scale = self.scaler.get_scale()
            for opt in self.optimizer.optimizers:
                self.scaler.step(opt)
            self.scaler.update()
            stepped = self.scaler.get_scale() >= scale  # lowered: the scaler skipped this step
            self.amp_skipped += not stepped
        elif self.t.skip_nonfinite and not torch.isfinite(grad_norm).item():
            stepped = False
            self.skipped += 1
        else:
            self.optimizer.step()
            stepped = True
        if stepped:
            self.raw_model.after_step()  # nGPT re-normalization: outside any compiled graph
        if self.qk_clip is not None:  # every step (a skipped one only resets), so DDP ranks stay in step
            self.qk_clip.step(apply=stepped)
        self.optimizer.zero_grad(set_to_none=True)
        return stepped

    def _make_scaler(self):
        """fp16's loss scaler (on CUDA; the config refuses fp16 elsewhere)."""
        return torch.amp.GradScaler(self.device.type) if self.cfg.precision == "fp16" else None

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
            if self.slow_eval and self.step == self.max_steps:
                time.sleep(self.slow_eval)
            batch = batch.to(self.device)
            with self.autocast():
                _, loss = self.model(batch[:, :-1], batch[:, 1:])
            total += loss.float()
        self.model.train()
        return (total / len(self.val_batches)).item()

    # ------------------------------------------------------------------- loop
    def fit(self) -> dict:
        cfg, t = self.cfg, self.t
        # wall clock and steady-state throughput (steps >= 5 of each segment, no eval/ckpt) go on
        # across a resume: the checkpoint carries them (self.clock)
        self.start_wall = start_wall = time.perf_counter() - self.clock["wall_s"]
        window_time, window_tokens = 0.0, 0
        pending: list[torch.Tensor] = []  # per-step losses on device, synced at log steps
        prev_votes = None  # torchrun, CUDA: the previous step's stop votes
        first_step = self.step
        if self.eval_missing:  # interrupted during this step's evaluation: do it now, into its record
            self._finish_eval()
        log.info(
            "training %d steps (%s tokens/step, %d already done) on %s, precision %s",
            self.max_steps,
            f"{self.tokens_per_step:,}",
            self.step,
            self.device,
            cfg.precision,
        )
        self.model.train()
        while self.step < self.max_steps:
            step = self.step
            if self.device.type == "cuda" and step - first_step == 5:
                torch.cuda.synchronize()  # the untimed first steps' queued GPU work must not leak into the timing
            t0 = time.perf_counter()
            lr = set_lr(self.optimizer, lr_factor(step, self.max_steps, self.sched))
            # the first step, every diag.every steps done (records at step 1, every, 2*every, ...) and the
            # last step (depth plots and per-layer statistics show the end of training)
            diag_now = self.diag.enabled and (
                step == 0 or (step + 1) % self.diag_every == 0 or step + 1 == self.max_steps
            )
            loss, grad_norm = self.train_step(diag_now)
            if diag_now:
                self.diag.before_step()
            self.optimizer_step(grad_norm)
            if diag_now:
                self.diag.after_step()
            pending.append(loss)
            self.step += 1
            self.tokens += self.tokens_per_step
            eval_now = self.step % t.eval_every == 0 or self.step in (1, self.max_steps)
            ckpt_now = self.step % t.ckpt_every == 0 and self.step < self.max_steps
            log_now = self.step % t.log_every == 0 or self.step == self.max_steps or diag_now or eval_now
            if log_now and self.device.type == "cuda":
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            if step - first_step >= 5:
                self.clock["train_time"] += dt
                self.clock["train_tokens"] += self.tokens_per_step
            window_time += dt
            window_tokens += self.tokens_per_step

            if log_now:
                losses = torch.stack(pending).tolist()
                pending.clear()
                status = self._check_losses(losses, grad_norm)
                tps = window_tokens / max(window_time, 1e-9)
                step_time = window_time * self.tokens_per_step / max(window_tokens, 1)
                window_time, window_tokens = 0.0, 0
                record = {
                    "step": self.step,
                    "tokens": self.tokens,
                    "loss": losses[-1],
                    "lr": lr,
                    "grad_norm": grad_norm.item(),
                    "tokens_per_s": tps,
                    "time_s": time.perf_counter() - start_wall,
                    "step_time_s": step_time,
                    "mfu": mfu(self.flops_per_token, tps, self.peak_flops, self.world),
                    "peak_mem_gb": peak_memory_gb(self.device),
                    "spikes": self.spike.count,  # loss spikes so far (diagnostics.SpikeDetector)
                }
                record.update(self.qk_clip.metrics() if self.qk_clip is not None else {})
                if spike_steps := self.spike.pop_steps():
                    record["spike_steps"] = spike_steps
                if diag_now:  # the diagnostic forward is training-time cost: counted in tokens/s
                    t_diag = time.perf_counter()
                    record.update(self.diag.collect())
                    t_diag = time.perf_counter() - t_diag
                    self.clock["train_time"] += t_diag if step - first_step >= 5 else 0.0
                    window_time += t_diag
                if eval_now and status is None:
                    val = self.evaluate()
                    self.eval_missing = val is None
                    if val is not None:
                        record["val_loss"] = self.last_val = val
                        self.best_val = min(self.best_val, self.last_val)
                self._emit(record, tps)
                self.loss_step = self.step
                self._update_summary(losses[-1], self.clock["train_tokens"], self.clock["train_time"], start_wall)
                if status is not None:
                    return self._finish("diverged", status)
            if self.world == 1:
                stop_now = self.stop_signal is not None
            else:
                # every rank reads the same vote (summed with the loss): on CPU this step's; on CUDA the
                # previous step's, so the host never waits for the step it has just queued
                votes = self.stop_votes if self.device.type != "cuda" else prev_votes
                prev_votes = self.stop_votes
                stop_now = votes is not None and votes.item() > 0
                if stop_now:  # which signal: the largest number any rank caught
                    self.stop_signal = dist_utils.any_rank_max(self.stop_signal or 0, self.device) or signal.SIGTERM
            if stop_now:
                STOP.safe_point()  # checkpoint and summary from here: the watchdog's deadline is off
            if stop_now or ckpt_now:
                # the losses since the last log step get a log step's bookkeeping before the checkpoint
                # takes the spike/divergence state, so a resume continues it exactly
                losses = torch.stack(pending).tolist() if pending else []
                status = self._check_losses(losses, grad_norm) if pending else None
                pending.clear()
                if status is not None:
                    return self._finish("diverged", status)
                if losses:  # "final loss" is this step's, not the last logged one's
                    self.summary.update(final_loss=losses[-1], step=self.step, tokens=self.tokens)
                    self.loss_step = self.step
                self.save_checkpoint()
            if stop_now:  # also during the last step or its evaluation: the resume finishes the run
                name = signal.Signals(self.stop_signal).name
                where = " (its evaluation was cut short)" if self.eval_missing else ""
                self._finish("interrupted", f"{name} at step {self.step}{where}; resume with trainer.resume=true")
                raise Interrupted(name)
        self.save_checkpoint()
        return self._finish("completed", None)

    def _finish_eval(self) -> None:
        """The evaluation a signal cut short at the checkpoint's step, done on resume: its val loss
        goes into that step's record, as in an uninterrupted run (evaluation draws no random numbers)."""
        val = self.evaluate()
        if val is None:
            return
        self.last_val, self.best_val, self.eval_missing = val, min(self.best_val, val), False
        if self.is_main:
            self.metrics.amend(self.step, {"val_loss": val})
            self.wandb.log({"step": self.step, "val_loss": val})
        self.summary.update(final_val_loss=val, best_val_loss=self.best_val)
        self.write_summary()

    def _check_losses(self, losses: list[float], grad_norm: torch.Tensor) -> str | None:
        """Divergence and spike bookkeeping over the losses since the last log step."""
        t = self.t
        for step, loss in enumerate(losses, self.step - len(losses) + 1):  # step numbers as in the records
            if not math.isfinite(loss):
                return f"non-finite loss ({loss}) at step {step}"
            if self.initial_loss is None:
                self.initial_loss = loss
            if loss > t.diverge_factor * self.initial_loss:
                return f"loss {loss:.3f} > {t.diverge_factor} x initial loss {self.initial_loss:.3f}"
            self.spike.update(loss, step)
        if self.skipped > t.max_skipped:
            return f"{self.skipped} optimizer steps skipped for non-finite gradients"
        return None

    def _emit(self, record: dict, tps: float) -> None:
        if not self.is_main:
            return
        self.metrics.write(record)
        self.wandb.log(record)
        if not hasattr(self, "eta"):
            self.eta = Eta()
        remaining = self.eta.remaining(self.step, self.max_steps, self.tokens_per_step / max(tps, 1e-9))
        val = f" | val {record['val_loss']:.4f}" if "val_loss" in record else ""
        log.info(
            "step %d/%d | loss %.4f%s | lr %.2e | grad %.3f | %s tok/s | ETA %s",
            self.step,
            self.max_steps,
            record["loss"],
            val,
            record["lr"],
            record["grad_norm"],
            f"{tps:,.0f}",
            _fmt_time(remaining),
        )

    def _update_summary(self, loss: float, train_tokens: int, train_time: float, start_wall: float) -> None:
        self.summary.update(
            step=self.step,
            tokens=self.tokens,
            final_loss=loss,
            final_val_loss=self.last_val,
            best_val_loss=self.best_val if math.isfinite(self.best_val) else None,
            tokens_per_s=(train_tokens / train_time) if train_time > 0 else None,
            step_time_s=(train_time * self.tokens_per_step / train_tokens) if train_tokens else None,
            mfu=mfu(self.flops_per_token, train_tokens / max(train_time, 1e-9), self.peak_flops, self.world),
            peak_mem_gb=peak_memory_gb(self.device),
            wall_s=time.perf_counter() - start_wall,
            spikes=self.spike.count,
            skipped_steps=self.skipped,
            amp_skipped_steps=self.amp_skipped,
        )

    def _finish(self, status: str, reason: str | None) -> dict:
        self.summary.update(status=status, reason=reason, step=self.step, tokens=self.tokens)
        if self.is_main:  # outcome (learned/unstable/stuck/diverged) and per-layer statistics
            baseline = outcomes.baseline_loss(self.data)
            self.summary.update(
                outcomes.run_results(self.summary, self.run_dir / "metrics.jsonl", baseline, self.spike.steps)
            )
        self.write_summary()
        if status == "diverged":
            log.warning("run diverged: %s", reason)
        else:
            log.info(
                "run %s at step %d: final loss %s (step %s), best val loss %s, %s tok/s",
                status,
                self.step,
                _fmt(self.summary["final_loss"]),
                getattr(self, "loss_step", self.step),
                _fmt(self.summary["best_val_loss"]),
                _fmt(self.summary["tokens_per_s"], ".0f"),
            )
        return self.summary

    def close(self, exit_code: int = 0) -> None:
        if self.is_main and hasattr(self, "metrics"):
            self.metrics.close()
        if self.is_main and hasattr(self, "wandb"):  # setup may have failed in between: keep its error
            self.wandb.finish(exit_code)


class Eta:
    """Time left: an exponential moving average of the wall time per step between log lines (evals,
    checkpoints and diagnostics included, as the rest of the run will have them), so the ETA does not
    jump with each window's mix of steps."""

    def __init__(self, weight: float = 0.3):
        self.weight, self.per_step, self.last = weight, None, None

    def remaining(self, step: int, max_steps: int, step_time_now: float) -> float:
        now = time.perf_counter()
        if self.last is not None and step > self.last[0]:
            rate = (now - self.last[1]) / (step - self.last[0])
            self.per_step = rate if self.per_step is None else (1 - self.weight) * self.per_step + self.weight * rate
        self.last = (step, now)
        return (max_steps - step) * (self.per_step if self.per_step is not None else step_time_now)


def _fmt(x, spec: str = ".4f") -> str:
    return "n/a" if x is None else format(x, spec)


def _fmt_time(seconds: float) -> str:
    seconds = int(seconds)
    return (
        f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"
    )


def run(cfg, run_dir: Path) -> dict:
    """Train one run into ``run_dir``; returns the summary. Raises ConfigError on bad input."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    dist_utils.export_submitit_env()  # a multi-task submitit (SLURM) job: DDP across its tasks
    rank = dist_utils.rank()
    setup_logging(run_dir, rank)
    if rank == 0:
        log.info("run directory: %s", run_dir.resolve())
    lock = RunLock(run_dir)
    if rank == 0:
        lock.acquire()
    trainer = Trainer(cfg, run_dir)
    # stop signals (normbench.signals): the step in progress ends, then checkpoint and `interrupted`.
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
    """The watchdog ends the process at once (normbench.signals): the summary says so first."""
    name = signal.Signals(signum).name
    log.warning("%s: %s: stopping at once at step %d; the last checkpoint is kept", name, why, trainer.step)
    if trainer.summary and trainer.is_main:
        reason = f"{name} at step {trainer.step} ({why}): stopped at once; resume with trainer.resume=true"
        summary = {**trainer.summary, "status": "interrupted", "reason": reason}
        write_json_now(summary, trainer.run_dir / "summary.json")
    lock.release()


def read_summary(run_dir: Path) -> dict:
    """A run's summary.json, {} when there is none (status ``unreadable`` when damaged: metrics.read_summary)."""
    return metrics.read_summary(run_dir) or {}


def read_status(run_dir: Path) -> str | None:
    return read_summary(run_dir).get("status")


def summary_for_failure(run_dir: Path, cfg, reason: str, status: str = "failed") -> None:
    """Record a job that failed before training could write its own summary (sweeps go on)."""
    path = Path(run_dir) / "summary.json"
    summary = read_summary(run_dir)
    summary.update(
        status=status, reason=reason, arch=cfg.arch.name, norm=cfg.norm.name, optim=cfg.optim.name, seed=cfg.seed
    )
    write_json_atomic(summary, path)
