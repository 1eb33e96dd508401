"""A finished (or interrupted) run directory read back: its config, model, tokenizer and summary."""

from __future__ import annotations

import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from normbench.errors import ConfigError
from normbench.run.reader import RunReader
from normbench.run.rundir import RunDir
from normbench.train import ckpt_store


@dataclass
class Run:
    path: Path
    cfg: object  # the run's resolved config (DictConfig)
    model: torch.nn.Module  # fp32, eval mode, on the CPU
    vocab_size: int  # the model's (padded) vocabulary
    step: int
    tokens: int
    summary: dict


def _config(run: RunReader, state: dict):
    """``.hydra/config.yaml`` over the schema (keys added since fill in), else the checkpoint's copy."""
    cfg = run.typed_config(fallback=state.get("config"))
    if cfg is None:
        raise ConfigError(f"{run.path} has no .hydra/config.yaml and its checkpoint holds no config")
    return cfg


def warn_if_live(run_dir: Path, step: int) -> None:
    """One line on stderr when ``run_dir``'s ``.lock`` names a live owner: the checkpoint is of a run still
    training (an owner on another host may be alive: rundir.RunDir.owner_alive cannot tell from here)."""
    rd = RunDir(run_dir)
    if not rd.owner_alive():
        return
    host, pid = rd.lock_owner()
    who = f"process {pid}" if host == socket.gethostname() else f"{host}:{pid}, on another host (it may have ended)"
    print(
        f"normbench: warning: {run_dir} is still being trained by {who} (its {rd.lock_path.name}); "
        f"this uses its last checkpoint, from step {step}, not the finished model",
        file=sys.stderr,
    )


def load_run(run_dir, warn: bool = True) -> Run:
    """The run at ``run_dir`` with its last checkpoint's weights; ConfigError (one line) otherwise.
    ``warn``: say on stderr when the run is still training (:func:`warn_if_live`)."""
    from normbench.model import build_model  # deferred (start-up time): hydra, omegaconf

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ConfigError(f"run directory {run_dir} does not exist")
    run = RunReader(run_dir)
    path = ckpt_store.latest(run.checkpoint_path.parent)  # last.pt, or an FSDP run's sharded step_<N>.dcp
    if path is None:
        raise ConfigError(
            f"{run_dir} has no checkpoint (expected {run.checkpoint_path}); "
            "a run writes one every trainer.ckpt_every steps and at its end"
        )
    state = ckpt_store.load(path)
    cfg = _config(run, state)
    weights = state["model"]
    if "wte.weight" not in weights:
        raise ConfigError(f"checkpoint {path} has no wte.weight: not a normbench model")
    vocab = int(weights["wte.weight"].shape[0])
    torch.manual_seed(0)  # build_model draws an init that the checkpoint then overwrites
    model = build_model(cfg, vocab)
    try:
        model.load_state_dict(weights)
    except RuntimeError as exc:
        first = next((ln.strip() for ln in str(exc).splitlines()[1:] if ln.strip()), str(exc))
        raise ConfigError(f"checkpoint {path} does not match the run's config ({first[:200]})") from None
    if warn:
        warn_if_live(run_dir, int(state["step"]))
    summary = run.summary
    if summary is None or summary.get("status") == "unreadable":
        summary = dict(state.get("summary") or {})
    return Run(run_dir, cfg, model.float().eval(), vocab, int(state["step"]), int(state["tokens"]), summary)


def run_tokenizer(cfg):
    """The run's normbench tokenizer (``bpe``: the trained one from the token cache, rebuilt if gone)."""
    from normbench.data.corpus import load_data  # deferred (start-up time): hydra, omegaconf, numpy
    from normbench.data.tokenizer import DOCUMENT_CORPORA, build_tokenizer  # deferred (start-up time): numpy

    name = cfg.data.tokenizer
    if name in ("byte", "gpt2") or name.startswith(("tiktoken:", "hf:")):
        return build_tokenizer(name, None, None, Path("."), eot=cfg.data.name in DOCUMENT_CORPORA)
    return load_data(cfg.data, log=lambda *_: None).tokenizer
