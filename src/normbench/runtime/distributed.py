"""Process-group helpers for torchrun: DDP, FSDP2, and a checkpoint format that fits both.

Only what the trainer needs, with torch's own pieces (torchtitan / nanoGPT):

- rank / world from the environment torchrun sets; ``init`` picks NCCL on GPU, gloo on CPU.
- :func:`wrap_model`: ``parallel=ddp`` -> ``DistributedDataParallel``; ``parallel=fsdp`` ->
  FSDP2 (``torch.distributed.fsdp.fully_shard`` on every block, then on the root; under bf16 a
  ``MixedPrecisionPolicy`` of bf16 parameters and fp32 reductions, as torchtitan's ``parallelize``);
  ``trainer.activation_checkpointing`` recomputes each block in backward (any ``parallel``).
  ``compile`` (as the run spec resolved it: config/spec.py) is applied here too: the whole model before
  DDP (nanoGPT), each block in place before ``fully_shard`` under FSDP (torchtitan), so parameter names
  never change.
- :func:`maybe_no_sync`: gradient sync only on the last micro-step (DDP ``no_sync``,
  FSDP2 ``set_requires_gradient_sync``). Both average gradients over ranks.
- :func:`clip_grad_norm_`: the total norm over all shards (an FSDP2 gradient is a
  ``DTensor``; its norm is reduced across ranks), returned as a plain tensor.
- Single-file checkpoints (one process, DDP; FSDP2's are sharded DCP, train/sharded.py) hold
  *full* (unsharded) state dicts, the optimizer's keyed by parameter name. :func:`full_state_dicts`
  and :func:`load_full_state_dicts` are ``torch.distributed.checkpoint.state_dict``'s
  ``get_*_state_dict`` / ``set_*_state_dict`` with ``full_state_dict=True`` (as torchtitan): the
  gather is collective and lands on rank 0's CPU, which writes; loading re-shards locally, so a
  checkpoint resumes under any world size and any ``parallel``.

- :func:`export_submitit_env`: a multi-task submitit (SLURM) job sets torch's env:// variables
  from its task ids (a sweep outside, DDP inside each job); :func:`check_config` refuses
  optimizers that cannot run on FSDP2 shards.

Single-process runs never touch ``torch.distributed``.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed._composable import checkpoint
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP

from normbench.config.spec import spec_of
from normbench.errors import ConfigError
from normbench.runtime.precision import autocast_dtype


def rank() -> int:
    return int(os.environ.get("RANK", 0))


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", 0))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", 1))


def export_submitit_env() -> bool:
    """Inside a submitit job with several tasks: set torch's env:// variables from it.

    hydra-submitit-launcher with ``hydra.launcher.tasks_per_node=N`` (times ``nodes``)
    starts N processes per job of a sweep; submitit's ``TorchDistributedEnvironment``
    turns the SLURM (or submitit-local) task ids into ``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` (a port derived from the job id):
    a sweep outside, DDP inside each job. Does nothing under torchrun (``RANK`` is set),
    outside submitit, or for a one-task job. Returns whether it exported.
    """
    if "RANK" in os.environ or not os.environ.get("SUBMITIT_EXECUTOR"):
        return False
    try:
        from submitit.helpers import TorchDistributedEnvironment  # optional dependency (the sweeps extra)

        env = TorchDistributedEnvironment()
    except Exception:  # submitit missing, or no job environment after all
        return False
    if env.world_size <= 1:
        return False
    env.export(set_cuda_visible_devices=False, overwrite=True)  # every task sees all GPUs: cuda:LOCAL_RANK
    return True


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def init(device: torch.device) -> None:
    if world_size() > 1 and not is_distributed():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend=backend)


def effective_parallel(cfg) -> str:
    """What actually runs: ``none`` in one process; DDP under torchrun unless FSDP is asked for."""
    if world_size() == 1:
        return "none"
    return "fsdp" if cfg.parallel == "fsdp" else "ddp"


# Optimizers whose update needs the whole matrix: Muon's Newton-Schulz orthogonalization
# and Adafactor's factored row/column moments. On FSDP2 shards the first is silently
# wrong (measured: losses drift from the single-process run), the second raises.
FSDP_UNSUPPORTED_OPTIMS = ("muon", "adafactor")


def check_config(cfg) -> None:
    """Refuse what cannot run correctly in this world; raises ConfigError (one line)."""

    if effective_parallel(cfg) == "fsdp" and cfg.optim.name in FSDP_UNSUPPORTED_OPTIMS:
        raise ConfigError(
            f"optim={cfg.optim.name} needs whole matrices, which parallel=fsdp shards; "
            f"use parallel=ddp (or optim=adamw/sgd/lion with fsdp)"
        )


def wrap_model(model: nn.Module, cfg, device: torch.device, log: Callable[[str], None] = print):
    """(the module the training loop calls (DDP/FSDP2/compiled), whether it compiles); ``model`` stays the raw one.

    Under FSDP2 ``model`` itself is sharded in place (its parameters become DTensors).
    """
    mode = effective_parallel(cfg)
    if mode == "none" and cfg.parallel != "none":
        log(f"note: parallel={cfg.parallel} ignored in a single process (launch with torchrun --nproc_per_node=N)")
    if mode != "none" and cfg.parallel == "none":
        log(f"note: WORLD_SIZE={world_size()} with parallel=none: using DDP")
    use_compile = spec_of(cfg).compile  # compile=auto resolved once (config/spec.py), logged at start-up
    if cfg.trainer.activation_checkpointing:
        checkpoint_activations(model)
    if use_compile:
        _prime_caches(model, device)
    if mode == "none":
        return (torch.compile(model) if use_compile else model), use_compile
    init(device)
    if mode == "ddp":
        inner = torch.compile(model) if use_compile else model
        log(f"parallel: DDP over {world_size()} processes ({dist.get_backend()})")
        return DDP(inner, device_ids=[device.index] if device.type == "cuda" else None), use_compile
    return _shard(model, cfg, device, use_compile, log), use_compile


def mixed_precision(cfg):
    """FSDP2's ``MixedPrecisionPolicy`` for the run's precision: bf16 parameters in forward and backward
    (all-gathers move bf16) with gradients reduced in fp32 (torchtitan's default); None otherwise (fp32;
    fp16 keeps autocast alone, its GradScaler unscales fp32 gradients)."""

    if autocast_dtype(cfg) != torch.bfloat16:
        return None
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def _shard(model: nn.Module, cfg, device: torch.device, use_compile: bool, log: Callable[[str], None]) -> nn.Module:
    """FSDP2 in place: each block its own unit (the last one kept gathered after forward: backward starts
    there), then the root, which holds the embedding and the head (tied: one parameter, gathered once per
    step, since FSDP2 keeps the root's parameters after forward) and the final norm."""

    mesh = init_device_mesh(device.type, (world_size(),))
    policy = mixed_precision(cfg)
    kwargs = {"mesh": mesh, **({"mp_policy": policy} if policy is not None else {})}
    for i, block in enumerate(model.blocks):
        if use_compile:
            block.compile()  # in place: parameter names (and checkpoints) stay the same
        fully_shard(block, reshard_after_forward=i < len(model.blocks) - 1, **kwargs)
    fully_shard(model, **kwargs)
    mp = ", bf16 parameters, fp32 gradient reduction" if policy is not None else ""
    log(f"parallel: FSDP2 over {world_size()} processes ({dist.get_backend()}), {len(model.blocks)} blocks + root{mp}")
    return model


def checkpoint_activations(model: nn.Module) -> None:
    """``trainer.activation_checkpointing``: each block's activations are recomputed in backward instead of
    kept (torch's composable ``checkpoint``, non-reentrant, the RNG replayed: the same numbers; parameter
    names unchanged). ConfigError (one line) for a model whose blocks keep running statistics, which a
    recomputed forward would update twice."""

    stateful = sorted({n.rsplit(".", 1)[-1] for n, _ in model.blocks.named_buffers() if "running" in n or "ema" in n})
    if stateful:
        raise ConfigError(
            "trainer.activation_checkpointing=true cannot be used with this norm: its blocks keep running "
            f"statistics ({', '.join(stateful)}) that a recomputed forward would update twice; "
            "use a norm without them (e.g. norm=rmsnorm or layernorm) or trainer.activation_checkpointing=false"
        )
    for block in model.blocks:
        checkpoint(block)


def _prime_caches(model: nn.Module, device: torch.device) -> None:
    """Build lazily cached tensors (the RoPE table) before compiling: one recompile fewer."""
    rope = getattr(model, "rope", None)
    if callable(rope):
        rope(device)


def maybe_no_sync(model: nn.Module, sync: bool):
    """Context for one micro-step: reduce gradients only when ``sync`` (the last micro-step)."""
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2 (recurses into the blocks)
        model.set_requires_gradient_sync(sync)
        return contextlib.nullcontext()
    if not sync and hasattr(model, "no_sync"):  # DDP
        return model.no_sync()
    return contextlib.nullcontext()


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    if is_distributed():
        t = t.clone()
        dist.all_reduce(t)
    return t


def any_rank_max(value: int, device: torch.device) -> int:
    """The largest ``value`` over all ranks (e.g. a caught signal number, 0 for none)."""
    if not is_distributed():
        return value
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def main_says(flag: bool, device: torch.device) -> bool:
    """Rank 0's ``flag`` on every rank (a decision from rank 0's clock that all must act on together)."""
    if not is_distributed():
        return flag
    t = torch.tensor([int(flag)], dtype=torch.int64, device=device)
    dist.broadcast(t, src=0)
    return bool(t.item())


def gather_to_main(obj) -> list | None:
    """Every rank's ``obj`` as a list on rank 0 (``None`` elsewhere); ``[obj]`` in one process."""
    if not is_distributed():
        return [obj]
    out = [None] * dist.get_world_size() if rank() == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out


def is_dtensor(t) -> bool:

    return isinstance(t, DTensor)


def clip_grad_norm_(params: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` that also works on FSDP2 DTensor gradients.

    The total 2-norm is taken over every shard of every gradient (torchtitan's recipe:
    ``get_total_norm`` gives a DTensor, ``full_tensor`` reduces it); returns a plain
    0-dim tensor, the norm before clipping. ``max_norm=inf`` only measures.
    """
    params = [p for p in params if p.grad is not None]
    grads = [p.grad for p in params]
    if not grads:
        return torch.zeros(())
    total = torch.nn.utils.get_total_norm(grads, norm_type=2.0, foreach=True)
    if is_dtensor(total):
        total = total.full_tensor()
    if math.isfinite(max_norm):
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total, foreach=True)
    return total


@torch.no_grad()
def zero_grads_unless(params: Iterable[torch.Tensor], ok: torch.Tensor) -> None:
    """Zero every gradient in place where the 0-dim bool ``ok`` is false, without reading it on the host (a
    step's non-finite check: trainer.skip_nonfinite). Where it is true nothing is written: the step stays exact.
    FSDP2 gradients are DTensors: their local shards are filled."""
    bad = ~ok
    for p in params:
        if p.grad is not None:
            (p.grad.to_local() if is_dtensor(p.grad) else p.grad).masked_fill_(bad, 0.0)


# ------------------------------------------------------------------ checkpoints
# torch.distributed.checkpoint.state_dict (torchtitan's route) gathers an FSDP2-sharded model
# and optimizer into full state dicts and shards them back; it works on plain modules too.
FULL_STATE = dict(full_state_dict=True, cpu_offload=True)  # gathered to CPU, kept on rank 0 only


def _optimizers(optimizer) -> tuple[torch.optim.Optimizer, ...]:
    return tuple(getattr(optimizer, "optimizers", None) or (optimizer,))


def full_state_dicts(model: nn.Module, optimizer) -> tuple[dict, dict]:
    """(model, optimizer) full state dicts on CPU, the same for any world size and ``parallel``.

    Collective under FSDP2 (every rank calls it); ranks other than 0 get empty dicts. The
    optimizer's dict is keyed by parameter name (``{"state": {name: ...}, "param_groups":
    [{"params": [name, ...], ...}]}``), one dict for all the optimizers of an OptimizerList.
    """

    options = StateDictOptions(**FULL_STATE)
    model_state = get_model_state_dict(model, options=options)
    optims = _optimizers(optimizer)
    if not any(opt.state for opt in optims):
        # no step taken yet: torch would initialise the state with a zero-lr step (a step count
        # of 1 that the run never took); the param groups are all there is to save
        return model_state, _by_name(model, optims, [opt.state_dict() for opt in optims])
    return model_state, get_optimizer_state_dict(model, optims, options=options)


def load_full_state_dicts(model: nn.Module, optimizer, model_state: dict, optim_state: dict) -> None:
    """Load full state dicts into ``model`` and ``optimizer``, re-sharding them under FSDP2.

    Every rank passes the whole dicts (read from the checkpoint); no communication. Checkpoints
    written before the optimizer state was keyed by name (``{"optimizers": [torch's
    id-keyed dicts]}``) are converted first, matching parameters by their position in the param
    groups as ``torch.optim.Optimizer.load_state_dict`` does.
    """
    from torch.distributed.checkpoint.state_dict import (  # local: the module binds this name otherwise
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, model_state, options=options)
    optims = _optimizers(optimizer)
    if "optimizers" in optim_state:
        optim_state = _by_name(model, optims, optim_state["optimizers"])
    groups = optim_state.get("param_groups", [])
    if len(groups) != sum(len(opt.param_groups) for opt in optims):
        raise ValueError(
            f"checkpoint has {len(groups)} optimizer param groups, this run "
            f"{sum(len(opt.param_groups) for opt in optims)} ({', '.join(type(o).__name__ for o in optims)})"
        )
    set_optimizer_state_dict(model, optims, optim_state, options=options)


def _by_name(model: nn.Module, optims, saved: list[dict]) -> dict:
    """torch's id-keyed optimizer state dicts (one per optimizer) as one name-keyed dict."""
    if len(saved) != len(optims):
        names = ", ".join(type(o).__name__ for o in optims)
        raise ValueError(f"checkpoint has {len(saved)} optimizer(s), this run {len(optims)} ({names})")
    name_of = {p: n for n, p in model.named_parameters()}
    state, groups = {}, []
    for opt, sd in zip(optims, saved):
        if len(sd["param_groups"]) != len(opt.param_groups):
            n_saved, n_live = len(sd["param_groups"]), len(opt.param_groups)
            raise ValueError(f"checkpoint has {n_saved} param groups, this optimizer {n_live}")
        for saved_group, live in zip(sd["param_groups"], opt.param_groups):
            if len(saved_group["params"]) != len(live["params"]):
                raise ValueError("checkpoint param groups differ in size from this optimizer's")
            names = [name_of[p] for p in live["params"]]
            state.update({n: sd["state"][pid] for pid, n in zip(saved_group["params"], names) if pid in sd["state"]})
            groups.append({**saved_group, "params": names})
    return {"state": state, "param_groups": groups}


def shutdown(wait: bool = True) -> None:
    """Destroy the process group (end of a torchrun job); a no-op in one process.

    ``wait``: meet the other ranks first, so no rank tears its connections down while
    another is still using them (skip it on an error path, where a peer may never come).
    """
    if is_distributed():
        if wait:
            with contextlib.suppress(Exception):
                dist.barrier()
        _RETIRED_GROUPS.append(dist.group.WORLD)
        dist.destroy_process_group()


# Process groups outlive ``shutdown`` until the process exits (torchrun workers leave by os._exit).
# Otherwise the last reference dies with the DDP/FSDP model (when the trainer is freed), and
# ~ProcessGroupGloo joins its worker threads while holding the GIL; a worker thread that is still
# freeing a finished collective (its tensors are Python objects) waits for the GIL: a deadlock,
# seen as a finished rank 1 that never exits (py-spy: Reducer dealloc -> ~ProcessGroupGloo ->
# thread::join, and runLoop -> ~AsyncBarrierWork -> ~AsyncGatherWork -> gil_scoped_acquire).
_RETIRED_GROUPS: list = []
