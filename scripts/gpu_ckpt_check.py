"""What a checkpoint costs the training, synchronous against background (trainer.ckpt_async), for gpu_check.sh.

Builds the model (default gpt2_124m at GPT-2's vocab) and AdamW on the device, takes two steps so the optimizer
holds its moments, then writes the run's checkpoint ``REPEATS`` times through normbench's own writer
(train/ckpt_writer.py) in each of four ways: the single file (one GPU, DDP) and sharded DCP (FSDP2's format,
here in one process), each synchronous and in the background. For each it prints the seconds the training is
held up (``blocking_s``: what ``ckpt_s`` in summary.json counts) and the seconds until the checkpoint is
committed (``total_s``), and the share of the default interval (trainer.ckpt_every_s) the blocking time is.
Everything is written under a temporary directory that is removed at the end: no checkpoint file is left.

    python scripts/gpu_ckpt_check.py                         # gpt2_124m on cuda, JSON lines on stdout
    python scripts/gpu_ckpt_check.py --out outputs/gpu_check/X   # also OUT/ckpt_cost.json
    python scripts/gpu_ckpt_check.py --model tiny --device cpu   # the CPU smoke run (tests/test_perf_scripts.py)
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from normbench.config.files import compose_config
from normbench.model import build_model
from normbench.optim.optimizers import build_optimizer
from normbench.runtime import distributed as du
from normbench.train import sharded
from normbench.train.ckpt_writer import CheckpointWriter


class _State:
    """The two views of a training state the writer asks for (train/state.py's, without the run around it)."""

    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer

    def _extra(self) -> dict:
        return {
            "step": 2,
            "tokens": 0,
            "sampler_rng": torch.get_rng_state(),
            "torch_rng": torch.get_rng_state(),
            "summary": {},
        }

    def state_dict(self) -> dict:
        model_state, optim_state = du.full_state_dicts(self.model, self.optimizer)
        return {"model": model_state, "optimizer": optim_state, **self._extra()}

    def sharded_state(self):
        return sharded.tensors(self.model, self.optimizer), self._extra()


def _built(model_name: str, device: torch.device):
    cfg = compose_config([f"model={model_name}", "data.tokenizer=gpt2", f"device={device.type}"])
    model = build_model(cfg, 50304 if model_name.startswith("gpt2") else 256).to(device)
    optimizer = build_optimizer(model, cfg, log=lambda *_: None)
    idx = torch.randint(0, 256, (2, 64), device=device)
    for _ in range(2):
        model(idx, idx)[1].backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return model, optimizer


def measure(model_name: str, device: torch.device, repeats: int, interval_s: float) -> list[dict]:
    model, optimizer = _built(model_name, device)
    state, rows = _State(model, optimizer), []
    root = Path(tempfile.mkdtemp(prefix="normbench-ckpt-cost-"))
    try:
        for fmt in ("file", "dcp"):
            for background in (False, True):
                ckpt_dir = root / f"{fmt}-{int(background)}"
                blocked = []
                writer = CheckpointWriter(
                    ckpt_dir,
                    sharded=fmt == "dcp",
                    background=background,
                    keep=(),
                    device=device,
                    spent=lambda what, s, acc=blocked: acc.append(s),
                )
                for step in range(1, repeats + 1):
                    blocked.clear()
                    t0 = time.perf_counter()
                    writer.save(state, step)
                    blocking = sum(blocked)
                    writer.wait()
                    rows.append(
                        {
                            "format": fmt,
                            "background": background,
                            "step": step,
                            "blocking_s": blocking,
                            "total_s": time.perf_counter() - t0,
                            "share_of_interval": blocking / interval_s,
                        }
                    )
                writer.close()
                size = sum(p.stat().st_size for p in ckpt_dir.rglob("*") if p.is_file())
                for row in rows[-repeats:]:
                    row["bytes"] = size
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gpt2_124m")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--repeats", type=int, default=2, help="writes per way (the first pays one-time costs)")
    p.add_argument("--interval-s", type=float, default=600.0, help="trainer.ckpt_every_s to express the cost in")
    p.add_argument("--out", type=Path, default=None, help="a directory for ckpt_cost.json")
    args = p.parse_args(argv)
    rows = measure(args.model, torch.device(args.device), args.repeats, args.interval_s)
    for row in rows:
        print(json.dumps(row))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "ckpt_cost.json").write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
