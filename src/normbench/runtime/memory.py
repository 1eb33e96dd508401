"""Peak-memory estimate of a training run, from its config, before the model is built.

A run that cannot fit (``model.seq_len=100000``, a big model on a small machine) is refused
with one line instead of allocating until the kernel's OOM killer ends it. The estimate
follows the usual accounting for transformer training (Korthikanti et al. 2022, "Reducing
Activation Recomputation in Large Transformer Models", arXiv:2205.05198, §4.1; the ZeRO
paper's 16 bytes/parameter for mixed-precision Adam, Rajbhandari et al. 2020):

- weights, gradients and optimizer state: fp32 copies of the parameters (counted on the
  meta device, so exactly the model normbench builds, with no memory used), 1 gradient, and
  per parameter 2 states (AdamW), 1 (Lion, SGD with momentum, Muon's matrices), or a
  factored row+column state (Adafactor); divided by the world size under FSDP;
- activations saved for backward, per layer and token, in units of ``d_model``, as counted
  with ``torch.autograd.graph.saved_tensors_hooks`` on this code's blocks (``_per_token``):
  11.5 d for attention with its input norm (norm in/out, the qkv buffer, rotated q/k, the
  kernel's output and statistics), 2 d plus 2 d_ff (GELU/ReLU) or 4 d_ff (SwiGLU) for the MLP
  with its norm, 2 d per extra norm site (Peri-LN's output norms, q/k norms; nGPT's ten
  normalisations); plus two layers' worth for backward's own working set;
- attention scores ``batch x heads x seq_len^2``, only where the kernel materialises them:
  PyTorch's math path, which CPU training takes with dropout; the flash / memory-efficient
  kernels (CPU without dropout, CUDA) keep O(seq_len) per row; ``diag=full``'s attention
  statistics materialise them for the diagnostic batch;
- the logits and their cross-entropy (log-softmax output, its gradient, the logits'
  gradient): 3 x batch x seq_len x vocab fp32 values.

Deviations, on purpose: no allocator fragmentation or workspace term (measured peaks sit
within the factor that tests/test_memory.py states), bf16/fp16 autocast counted at 2.5 bytes
per activation value (matmul outputs in 16 bit, norms and softmax in fp32), and
``torch.compile`` (which saves less) counted as eager, so it over-estimates there.

Limit: CUDA, the free memory ``torch.cuda.mem_get_info`` reports; CPU, ``MemAvailable``
from /proc/meminfo (psutil's ``available`` where /proc is absent), capped by a cgroup
(container, SLURM job) memory limit, shared by the ranks of a CPU torchrun.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from normbench.config.arch_traits import arch_traits
from normbench.config.schema import qk_norm_mode
from normbench.config.spec import spec_of
from normbench.errors import ConfigError
from normbench.model import build_model

GB = 1024**3
_BACKWARD_LAYERS = 2  # backward's working set: about two layers' worth of activation gradients and temporaries


@dataclass
class Estimate:
    params: int
    states: float  # bytes: weights + gradients + optimizer state
    activations: float  # bytes saved for backward, one micro-batch
    attention: float  # bytes of materialised attention scores (0 with a fused kernel)
    logits: float  # bytes of logits and cross-entropy buffers

    @property
    def total(self) -> float:
        return self.states + self.activations + self.attention + self.logits

    def describe(self) -> str:
        parts = [("weights+grads+optimizer", self.states), ("activations", self.activations)]
        if self.attention:
            parts.append(("attention scores", self.attention))
        parts.append(("logits", self.logits))
        return ", ".join(f"{name} {_gb(b)}" for name, b in parts)


def _gb(b: float) -> str:
    if b < 0.1 * GB:
        return f"{b / 1024**2:.1f} MB"
    return f"{b / GB:.2f} GB" if b < 10 * GB else f"{b / GB:,.0f} GB"


def count_params(cfg, vocab: int) -> tuple[int, list[tuple[str, tuple[int, ...]]]]:
    """(parameter count, [(name, shape)]) of the model ``build_model`` makes, built on the meta device."""

    with torch.device("meta"):
        model = build_model(cfg, vocab)
    shapes = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    return sum(math.prod(s) for _, s in shapes), shapes


def _optimizer_values(cfg, shapes: list[tuple[str, tuple[int, ...]]]) -> float:
    """Optimizer-state values (not bytes) for these parameters."""
    o = cfg.optim
    n = sum(math.prod(s) for _, s in shapes)
    if o.name == "adamw":
        return 2 * n
    if o.name in ("lion",) or (o.name == "sgd" and o.momentum > 0):
        return n
    if o.name == "sgd":
        return 0
    if o.name == "muon":  # momentum on hidden matrices, AdamW (2 states) on the rest
        hidden = sum(math.prod(s) for name, s in shapes if len(s) == 2 and "wte" not in name and "head" not in name)
        return hidden + 2 * (n - hidden)
    # adafactor: factored second moment (rows + columns) for matrices, full for vectors
    return sum((s[0] + s[-1]) if len(s) >= 2 else math.prod(s) for _, s in shapes)


def _per_token(cfg) -> float:
    """Activation values saved for backward per token and layer (see the module docstring)."""
    m = cfg.model
    d = m.d_model
    d_ff = m.d_ff or (32 * math.ceil(8 * d / 3 / 32) if m.mlp == "swiglu" else 4 * d)
    attn = 11.5 * d
    traits = arch_traits(cfg.arch.name)
    mlp = 2 * d + (4 * d_ff if (traits.own_mlp or m.mlp) == "swiglu" else 2 * d_ff)
    # the arch's extra norm sites per layer (config/arch_traits.py ArchTraits), each saving input and output
    extra = 2 * d * (traits.extra_norms + (1 if qk_norm_mode(cfg.arch.qk_norm) != "none" else 0))
    if traits.mid_norm:  # NormFormer's FFN norm over d_ff
        extra += 2 * d_ff
    if cfg.arch.attn_gate != "none":  # gate logits and sigmoid
        extra += 2 * (d if cfg.arch.attn_gate == "elementwise" else m.n_head)
    masks = 2 * d / 4 if m.dropout > 0 else 0  # bool dropout masks, 1 byte each
    return attn + mlp + extra + masks


def estimate(cfg, vocab: int, device_type: str = "cpu", world: int = 1) -> Estimate:
    m, t = cfg.model, cfg.trainer
    params, shapes = count_params(cfg, vocab)
    shard = world if cfg.parallel == "fsdp" and world > 1 else 1
    states = 4 * (2 * params + _optimizer_values(cfg, shapes)) / shard
    if cfg.parallel == "ddp" and world > 1:
        states += 4 * params  # DDP's gradient buckets
    act_bytes = 4.0 if spec_of(cfg).precision == "fp32" else 2.5  # precision=auto resolved (config/spec.py)
    tokens = t.batch_size * m.seq_len  # one micro-batch: gradient accumulation runs them one at a time
    activations = act_bytes * tokens * ((m.n_layer + _BACKWARD_LAYERS) * _per_token(cfg) + 2 * m.d_model)
    heads = m.n_head
    math_path = device_type == "cpu" and m.dropout > 0
    attention = 0.0
    if math_path:  # softmax output, dropout mask and dropped probabilities saved per layer
        attention = act_bytes * 3 * t.batch_size * heads * m.seq_len**2 * m.n_layer
    if cfg.diag.name == "full":  # attention statistics on the diagnostic batch, no grad, one layer at a time
        attention = max(attention, 4 * 3 * cfg.diag.batch * heads * m.seq_len**2)
    logits = 4 * 3 * tokens * vocab
    return Estimate(params, states, activations, attention, logits)


def available(device: torch.device) -> tuple[float | None, str]:
    """(bytes this run may use, what that is) on ``device``; (None, why) when unknown."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return float(free), f"{device} (free memory)"
    avail = _mem_available()
    if avail is None:
        return None, "unknown"
    what = "this machine (available RAM)"
    cgroup = _cgroup_room()
    if cgroup is not None and cgroup < avail:
        avail, what = cgroup, "this job's cgroup (memory limit minus usage)"
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", 1))  # CPU torchrun: the ranks share the RAM
    if ranks > 1:
        return avail / ranks, f"{what}, shared by {ranks} ranks"
    return avail, what


def _mem_available() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import psutil  # optional: macOS and others without /proc
    except ImportError:
        return None
    return float(psutil.virtual_memory().available)


def _cgroup_room() -> float | None:
    """Memory left under a cgroup limit (v2 ``memory.max``, v1 ``memory.limit_in_bytes``), if any."""
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        try:
            limit = Path(limit_file).read_text().strip()
            usage = float(Path(usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and float(limit) < 2**60:  # "max" or a huge number: no limit
            return max(0.0, float(limit) - usage)
    return None


def check(cfg, vocab: int, device: torch.device, log=print, world: int = 1) -> Estimate:
    """Refuse (ConfigError, one line) a run whose estimate exceeds what ``device`` has, unless
    ``trainer.skip_memory_check``; log the estimate either way."""
    est = estimate(cfg, vocab, device.type, world)
    limit, what = available(device)
    if limit is None:
        log(f"memory: estimate {_gb(est.total)} ({est.describe()}); the available memory is unknown here")
        return est
    line = f"memory: estimate {_gb(est.total)} ({est.describe()}), {_gb(limit)} available on {what}"
    if est.total <= limit:
        log(line)
        return est
    if cfg.trainer.skip_memory_check:
        log(f"{line}: more than available; training anyway (trainer.skip_memory_check=true)")
        return est
    raise ConfigError(
        f"this run needs about {_gb(est.total)} of memory ({est.describe()}) but {what} has {_gb(limit)}; "
        "lower trainer.batch_size (and raise trainer.grad_accum to keep the batch), model.seq_len or the model "
        "size, or set trainer.skip_memory_check=true if you know better"
    )
