"""The training state: everything a checkpoint holds, listed once.

As torchtitan's ``TrainState`` + checkpoint manager: :meth:`TrainState.state_dict` is the only place
that says what ``checkpoints/last.pt`` contains, and :meth:`TrainState.load_state_dict` the only
place that reads it back. The format (a flat dict of tensors and plain data, loaded with
``weights_only=True``) is the one of docs/contract.md §3 and stays readable by every version:

- ``model``, ``optimizer``: full (unsharded) state dicts, one format for every world size and
  parallel mode (re-sharded under FSDP2 by distributed.py). Under FSDP2 they are written as DCP
  shards instead (:meth:`TrainState.sharded_state`, train/sharded.py) and every other key below goes
  into the sharded checkpoint's ``extra.pt``, unchanged;
- ``scaler``: fp16's GradScaler (loss scale and growth counter), or None;
- ``sampler_rng`` (the data position: the sampler's generator), ``torch_rng``, ``cuda_rng`` and
  ``rank_rng`` (each rank's dropout stream);
- the counters: ``step``, ``tokens``, ``skipped``, ``amp_skipped``, ``clock`` (throughput.py),
  ``wandb_id``; the loop parts' own keys (loop_parts.py): the evaluation's ``best_val``, ``last_val``,
  ``eval_missing``, the loss watch's ``initial_loss``, ``spikes``, ``recent_losses`` and
  ``spike_steps_unlogged``;
- ``summary`` (the run's summary so far) and ``config`` (the flat config, checked on resume).
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import torch

from normbench.errors import ConfigError
from normbench.optim.optimizers import lr_factor
from normbench.run.resume import check_resume_config, flat_config
from normbench.runtime import distributed as dist_utils
from normbench.runtime.throughput import Throughput
from normbench.train import checkpoint as ckpt
from normbench.train import ckpt_store, sharded
from normbench.train.loop_parts import Evaluation, LossWatch

log = logging.getLogger("normbench")


class TrainState:
    def __init__(self, cfg, components, meter: Throughput, evals: Evaluation, losses: LossWatch, summary: dict):
        c = components
        self.model, self.optimizer, self.scaler, self.sampler = c.raw_model, c.optimizer, c.scaler, c.batches.gen
        self.meter, self.summary, self.device = meter, summary, c.device
        self.evals, self.losses = evals, losses  # the loop parts whose state a checkpoint keeps
        self.config, self.seed, self.dropout = flat_config(cfg), cfg.seed, cfg.model.dropout
        self.rank, self.world = dist_utils.rank(), dist_utils.world_size()
        self.step, self.tokens = 0, 0
        self.skipped = 0  # non-finite steps skipped by trainer.skip_nonfinite (count toward max_skipped)
        self.amp_skipped = 0  # fp16: steps GradScaler skipped on overflow, lowering the scale (routine)
        self.wandb_id: str | None = None
        self.resumed_summary: dict = {}  # the checkpoint's summary: a resumed run keeps its final numbers

    def state_dict(self) -> dict | None:
        """The single-file checkpoint. Collective under torchrun (every rank calls it); the dict on rank 0,
        None elsewhere."""
        model_state, optim_state = dist_utils.full_state_dicts(self.model, self.optimizer)
        extra = self._extra()
        return None if extra is None else {"model": model_state, "optimizer": optim_state, **extra}

    def sharded_state(self) -> tuple[dict, dict | None]:
        """The sharded checkpoint (train/sharded.py): this rank's shards of the model and optimizer, and the
        rest on rank 0 (None elsewhere). Collective under torchrun."""
        return sharded.tensors(self.model, self.optimizer), self._extra()

    def _extra(self) -> dict | None:
        """Everything but the model and optimizer, on rank 0 (None elsewhere); collective (each rank's RNG)."""
        rank_rng = dist_utils.gather_to_main(self._rng_state())  # dropout streams differ per rank
        if self.rank != 0:
            return None
        return {
            "step": self.step,
            "tokens": self.tokens,
            **self.evals.state_dict(),  # best_val, last_val, eval_missing
            **self.losses.state_dict(),  # initial_loss, spikes, recent_losses, spike_steps_unlogged
            "skipped": self.skipped,
            "amp_skipped": self.amp_skipped,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "wandb_id": self.wandb_id,
            "summary": dict(self.summary),
            "clock": self.meter.state_dict(),
            "sampler_rng": self.sampler.get_state(),
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            "rank_rng": rank_rng,
            "config": self.config,
        }

    def resume(self, ckpt_dir: Path, cfg, max_steps: int, sched) -> bool:
        """Load the run's checkpoint in ``ckpt_dir`` (train/ckpt_store.py: the single file or the newest
        sharded one) when ``trainer.resume`` asks for it; whether it did. A fresh run sets old checkpoints
        aside; a resume refuses a checkpoint of another config (run/resume.check_resume_config)."""
        if not cfg.trainer.resume:
            if self.rank == 0:  # a fresh run here: a later resume must not pick up the old one
                ckpt_store.set_aside(ckpt_dir)
            return False
        path = ckpt_store.latest(ckpt_dir)
        if path is None:
            log.info("trainer.resume=true but no checkpoint in %s: starting from step 0", ckpt_dir)
            return False
        state = sharded.read_extra(path) if path.is_dir() else ckpt.load(path)
        old_cfg = state.get("config") if isinstance(state.get("config"), dict) else {}
        diff = check_resume_config(old_cfg, self.config, list(cfg.trainer.resume_allow_changed), path)
        if not isinstance(state["step"], int) or state["step"] > max_steps:
            raise ConfigError(
                f"checkpoint {path} is at step {state['step']}, past trainer.max_steps={max_steps}; "
                "to train on, raise trainer.max_steps and add trainer.resume_allow_changed=[trainer.max_steps]"
            )
        _warn_schedule_change(state, old_cfg, max_steps, sched)
        if path.is_dir():  # its shards, read by each rank for its own part
            sharded.load_into(path, self.model, self.optimizer, bool(state.get("optimizer_saved")))
        self.load_state_dict(state, path)
        log.info("resumed from %s at step %d%s", path, self.step, f" (changed: {', '.join(diff)})" if diff else "")
        return True

    def load_state_dict(self, state: dict, path) -> None:
        """Restore a checkpoint (``path`` names it in errors); the model's keys must fit (ConfigError). A
        sharded checkpoint's ``extra`` has no ``model``: its shards were read by :meth:`resume`."""
        if "model" in state:
            self._load_weights(state, path)
        self.resumed_summary = state.get("summary") if isinstance(state.get("summary"), dict) else {}
        self.step, self.tokens = state["step"], state["tokens"]
        if isinstance(state.get("clock"), dict):
            self.meter.load_state_dict(state["clock"])
        self.evals.load_state_dict(state)
        self.losses.load_state_dict(state)
        self.skipped = state.get("skipped", 0)
        self.amp_skipped = state.get("amp_skipped", 0)
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])  # the loss scale and its growth counter go on
        self.wandb_id = state.get("wandb_id")
        self.sampler.set_state(state["sampler_rng"])
        self._restore_rng(state)

    def _load_weights(self, state: dict, path) -> None:
        """The single file's full state dicts, re-sharded under FSDP."""
        try:
            dist_utils.load_full_state_dicts(self.model, self.optimizer, state["model"], state["optimizer"])
        except (RuntimeError, KeyError, ValueError, TypeError, AttributeError) as exc:
            lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()] or [type(exc).__name__]
            why = next((ln for ln in lines if "mismatch" in ln or "key(s)" in ln), lines[0])  # state_dict details
            raise ConfigError(f"checkpoint {path} does not fit this model ({why[:200]})") from None

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
            torch.manual_seed(self.seed + 1_000_003 * self.rank + 7919 * self.step)
            if self.dropout > 0:
                log.info("note: resumed on a new world size; dropout masks continue from a fresh per-rank stream")
            return
        torch.set_rng_state(state["torch_rng"])
        if torch.cuda.is_available() and state.get("cuda_rng") is not None:
            torch.cuda.set_rng_state_all(state["cuda_rng"])


def _warn_schedule_change(state: dict, old_cfg: dict, max_steps: int, sched) -> None:
    """The LR schedule is a function of (step, max_steps): a new run length moves the LR at the resume step."""
    old_max = (state.get("summary") or {}).get("max_steps") or old_cfg.get("trainer.max_steps")
    step = state["step"]
    if not isinstance(old_max, int) or old_max == max_steps or step >= max_steps:
        return
    # ``sched`` carries this run's resolved warmup; the old length's is its own (null: 10% of the old length)
    old_sched = SimpleNamespace(**{**vars(sched), "warmup_steps": old_cfg.get("sched.warmup_steps")})
    before = lr_factor(min(step, old_max - 1), old_max, old_sched)
    after = lr_factor(step, max_steps, sched)
    if abs(after - before) > 0.01 * max(before, after):
        log.warning(
            "run length changed %d -> %d steps: the LR at step %d moves from %.3g to %.3g x optim.lr "
            "(sched=%s is laid over the new length; sched=wsd extends smoothly while still in its stable phase)",
            *(old_max, max_steps, step, before, after, sched.name),
        )
