"""Layer redundancy: the val loss with each block skipped at evaluation (an identity in its place).

The measurement of Men et al. 2024 ("ShortGPT", arXiv:2403.03853) and of the Mix-LN paper
(Li et al. 2024, arXiv:2412.13795, Fig. 1: dropping a deep Pre-LN layer barely moves the
loss). Here: the trained model of a finished run (``checkpoints/last.pt``), the run's own val
batches in the run's own precision, one block replaced by the identity at a time. Written to
``layer_skip.json`` in the run dir: ``base`` (val loss with every block), ``skipped`` (the loss with block i
skipped) and ``increase`` (skipped - base). Runs without a checkpoint (diverged before one) get none; a corrupt
checkpoint is refused with one line naming it (:func:`normbench.train.checkpoint.load`), and nothing is written.
"""

from __future__ import annotations

import json
from pathlib import Path


def skip_losses(run_dir: Path) -> dict | None:
    import torch  # deferred (start-up time): torch

    from normbench.data.batches import fixed_batches  # deferred (start-up time): torch, numpy
    from normbench.data.corpus import load_data  # deferred (start-up time): hydra, omegaconf, numpy
    from normbench.model import build_model, padded_vocab  # deferred (start-up time): torch, hydra, omegaconf
    from normbench.run.reader import RunReader  # deferred (start-up time): yaml
    from normbench.runtime.precision import autocast  # deferred (start-up time): torch
    from normbench.train import ckpt_store  # deferred (start-up time): torch
    from normbench.train.build import VAL_SEED  # deferred (start-up time): torch, hydra, omegaconf

    run = RunReader(run_dir)
    path = ckpt_store.latest(run.checkpoint_path.parent)
    if path is None or not run.dir.config_path.is_file():
        return None
    weights = ckpt_store.load(path)["model"]  # first: a corrupt checkpoint is refused (one line) before any work
    cfg = run.typed_config()
    data = load_data(cfg.data, log=lambda *_: None)
    device = torch.device("cuda" if torch.cuda.is_available() and cfg.device != "cpu" else "cpu")
    model = build_model(cfg, padded_vocab(cfg, data.vocab_size))
    model.load_state_dict(weights)
    model.to(device).eval()
    T, t = cfg.model.seq_len, cfg.trainer
    # the run's own val batches: the trainer's fixed validation window (train/build.py)
    batches = [b.to(device) for b in fixed_batches(data.val, t.eval_batches, t.batch_size, T, seed=VAL_SEED)]

    in_precision = autocast(cfg, device)  # the run's own numerics (a bf16 run evaluated in bf16, as its trainer did)

    @torch.no_grad()
    def val_loss() -> float:
        with in_precision():
            return sum(model(b[:, :-1], b[:, 1:])[1].item() for b in batches) / len(batches)

    base = val_loss()
    skipped = []
    for i, block in enumerate(list(model.blocks)):
        model.blocks[i] = _identity()
        skipped.append(val_loss())
        model.blocks[i] = block
    out = {"base": base, "skipped": skipped, "increase": [s - base for s in skipped]}
    run.dir.layer_skip_path.write_text(json.dumps(out, indent=1))
    return out


def _identity():
    import torch  # deferred (start-up time): torch

    class Identity(torch.nn.Module):
        """A block that passes the residual stream through (called like a block: ``(x, rope)``)."""

        def forward(self, x, *args):
            return x

    return Identity()


def read_skip(run_dir: Path) -> dict | None:
    from normbench.run.reader import RunReader  # deferred (start-up time): yaml

    return RunReader(run_dir).layer_skip()
