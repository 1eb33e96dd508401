"""Process-group helpers for torchrun (DDP now; FSDP2 through ``parallel=fsdp``).

Only what the trainer needs: rank/world from the environment torchrun sets,
model wrapping, ``no_sync`` on all but the last micro-step, and a loss
all-reduce. Single-process runs never touch ``torch.distributed``.
"""

from __future__ import annotations

import contextlib
import os

import torch
import torch.distributed as dist


def rank() -> int:
    return int(os.environ.get("RANK", 0))


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", 0))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", 1))


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def init(device: torch.device) -> None:
    if world_size() > 1 and not is_distributed():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend=backend)


def wrap_model(model: torch.nn.Module, cfg, device: torch.device) -> torch.nn.Module:
    if cfg.parallel == "none" or world_size() == 1:
        return model
    init(device)
    if cfg.parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model


def maybe_no_sync(model: torch.nn.Module, sync: bool):
    if not sync and hasattr(model, "no_sync"):
        return model.no_sync()
    if not sync and hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(False)
        return contextlib.nullcontext()
    if sync and hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(True)
    return contextlib.nullcontext()


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    if is_distributed():
        t = t.clone()
        dist.all_reduce(t)
    return t


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def shutdown() -> None:
    if is_distributed():
        dist.destroy_process_group()
