"""Weights & Biases logging (``logger=wandb``); a no-op unless enabled, rank 0 only.

Per-layer lists become flat keys in sections (``grad_norm_layer`` ->
``grad_norm_layer/layer_03``) so W&B draws one panel group per metric. Each
run calls ``finish()`` so the next job of an in-process sweep gets its own
run; the run id is kept in the checkpoint so a resumed run continues it.
Without credentials an online run falls back to offline with a warning.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from omegaconf import OmegaConf

log = logging.getLogger("normbench")


def flatten_record(record: dict) -> dict:
    out = {}
    for key, value in record.items():
        if isinstance(value, list):
            for i, v in enumerate(value):
                out[f"{key}/layer_{i:02d}"] = v
        elif value is not None:
            out[key] = value
    return out


def _has_credentials() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    return netrc.exists() and "api.wandb.ai" in netrc.read_text(errors="replace")


class WandbLogger:
    def __init__(self, cfg, run_dir: Path, resume_id: str | None = None):
        self.run = None
        self.run_id = resume_id
        wcfg = cfg.logger.wandb
        if not (wcfg.enabled or cfg.logger.name == "wandb"):
            return
        import wandb

        mode = wcfg.mode or os.environ.get("WANDB_MODE", "online")
        if mode == "online" and not _has_credentials():
            log.warning(
                "logger=wandb: no W&B credentials (WANDB_API_KEY or `wandb login`); logging offline "
                "to %s/wandb (upload later with `wandb sync`)",
                run_dir,
            )
            mode = "offline"
        group = wcfg.group or _sweep_group(run_dir)
        tags = list(wcfg.tags) or [cfg.arch.name, cfg.norm.name, cfg.optim.name]
        self.run = wandb.init(
            project=wcfg.project,
            entity=wcfg.entity,
            group=group,
            tags=tags,
            job_type=wcfg.job_type,
            name=_run_name(run_dir, cfg),
            config=OmegaConf.to_container(cfg, resolve=True),
            dir=str(run_dir),
            mode=mode,
            id=resume_id,
            resume="allow" if resume_id else None,
            reinit="finish_previous",
        )
        self.run_id = self.run.id

    def log(self, record: dict) -> None:
        if self.run is not None:
            self.run.log(flatten_record(record), step=record["step"])

    def finish(self, exit_code: int = 0) -> None:
        if self.run is not None:
            self.run.finish(exit_code=exit_code)
            self.run = None


def _sweep_group(run_dir: Path) -> str:
    """Jobs of one multirun share a group: the sweep directory's date/time."""
    parent = run_dir.resolve().parent
    return f"{parent.parent.name}/{parent.name}" if (run_dir / ".hydra").exists() else run_dir.name


def _run_name(run_dir: Path, cfg) -> str:
    overrides = run_dir / ".hydra" / "overrides.yaml"
    if overrides.exists():
        items = OmegaConf.load(overrides)
        if items:
            return " ".join(str(i) for i in items)
    return f"{cfg.arch.name}-{cfg.norm.name}-s{cfg.seed}"
