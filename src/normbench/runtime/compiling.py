"""``compile=true|false|auto``: when ``torch.compile`` pays for itself.

``torch.compile`` (inductor) makes a training step faster but costs a one-off compile at
the first training step and at the first evaluation (a second, no-grad graph). It is worth
it when the run is long enough for the per-step saving to repay that time:

    compile  <=>  steps x (estimated eager step time) x SAVING  >  COMPILE_S

- estimated eager step time = model FLOPs per optimizer step (``6N + 12LdT`` per token,
  :mod:`normbench.runtime.flops`, times tokens per step) / the eager FLOP/s the device reaches;
- ``SAVING``: the fraction of the eager step time compile removes;
- ``COMPILE_S``: seconds of compiling (both graphs) before the run reaches its steady state.

The constants per device type are in :data:`PROFILES` (sources in docs/performance.md §3).
CPU, measured with ``scripts/bench_throughput.py --suite compile`` and ``scripts/profile_step.py`` on
one thread: eager ``model=tiny`` (d 64, 4 blocks) reaches ~33 GFLOP/s of model FLOPs, ``model=small``
(d 128) ~53; compile removes 28% of tiny's step per CPU-second and 13-14% of small's. A step is matrix
products (FLOPs ~ d^2 per token) plus memory-bound work (~ d), which is what inductor fuses, so the rule
scales both from d 64 with the width: the eager rate like d (capped at small's), the saving like 1/d.
Compiling costs 39-51 s cold and 3-6 s with a warm cache (inductor's FX-graph and AOTAutograd caches,
on by default and shared by every process of the machine); a claim's seeds share one model, so
:mod:`normbench.reproduce.length` passes ``runs_per_graph`` = its seeds, and the cold compile is
shared by them. CUDA: nothing measured yet (no GPU was lent when this was written): the eager
throughput is taken as 25% of the bf16 peak (:func:`flops.peak_flops`, or 100 TFLOP/s for an unknown
GPU), the saving as 30% (nanoGPT reports 250 -> 135 ms per step for GPT-2 124M, i.e. 46%; 30% is on
the safe side) and the compile time as 90 s (about a minute per graph for gpt2_124m).
``scripts/gpu_check.sh`` prints the compile time per arch and Pre-LN's compile speed-up on a GPU, so
that row can be replaced by measurements. Without a C++ compiler (inductor's CPU backend needs one)
``compile=auto`` stays eager.

The rule is an estimate, logged with its numbers at start-up; ``compile=true`` and
``compile=false`` bypass it. A run's ``compile=auto`` (the default) applies it on CUDA only and stays
eager on CPU (config/spec.resolve_compile): a compiled run's losses agree with eager mode to ~1e-3
relative, not bit for bit, and a CPU default that changed with the run's length would make short and
long runs differ in that way. ``reproduce`` applies it on either device, once per claim
(reproduce/length.pin_compile), and hands every job the same ``compile=true|false``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from normbench.model import build_model
from normbench.runtime import length
from normbench.runtime.distributed import local_rank
from normbench.runtime.flops import model_flops_per_token, peak_flops

CHOICES = (True, False, "auto")


@dataclass(frozen=True)
class Profile:
    eager_flops: float  # model FLOP/s an eager step reaches (CPU: per thread; CUDA: fraction of peak)
    saving: float  # fraction of the eager step time that compile removes
    compile_s: float  # seconds of compiling before the steady state, cold inductor cache
    warm_s: float = 0.0  # the same with a warm cache (the graph compiled before, on this machine)
    ref_width: int | None = None  # CPU: the d_model eager_flops and saving were measured at (None: constants)
    eager_flops_max: float = 0.0  # CPU: the cap of eager_flops as the width grows (about the matmul rate)

    def eager_at(self, d_model: int, measured: float | None = None) -> float:
        """Eager FLOP/s at this width. CPU: the matrix products' share of a step grows about like d (their
        FLOPs go as d^2 per token, the memory-bound rest as d), so the rate does, up to the products' own.
        ``measured``: this machine's rate at ``ref_width`` in place of the profile's (the cap scales with it)."""
        base = self.eager_flops if measured is None else measured
        if self.ref_width is None:
            return base
        return min(base * d_model / self.ref_width, self.eager_flops_max * base / self.eager_flops)

    def saving_at(self, d_model: int) -> float:
        """The share compile removes at this width. CPU: what it fuses is the memory-bound rest, whose share of
        the step falls about like 1/d (measured: 28% at d 64, 13-14% at d 128, docs/performance.md §3)."""
        return self.saving if self.ref_width is None else self.saving * min(1.0, self.ref_width / d_model)

    def compile_cost(self, runs_per_graph: int = 1) -> float:
        """Seconds of compiling per run when ``runs_per_graph`` runs share one graph (a claim's seeds): the
        first pays the cold compile, the rest find inductor's caches warm (on by default, per machine)."""
        n = max(1, runs_per_graph)
        return self.warm_s + (self.compile_s - self.warm_s) / n


PROFILES = {
    # 2-core CPU, torch 2.13, one thread: tiny (d 64, 4 blocks) and small (d 128); docs/performance.md §3
    "cpu": Profile(eager_flops=3.3e10, saving=0.28, compile_s=50.0, warm_s=6.0, ref_width=64, eager_flops_max=5.3e10),
    # assumptions until measured on a GPU (module docstring)
    "cuda": Profile(eager_flops=0.25, saving=0.30, compile_s=90.0),
}
UNKNOWN_GPU_PEAK = 100e12  # FLOP/s assumed for a GPU the peak table does not know


def has_cpp_compiler() -> bool:
    """Whether inductor finds the C++ compiler its CPU code needs (``CXX`` or g++/clang++ on PATH)."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler  # its failure is handled here

        return bool(get_cpp_compiler())
    except Exception:  # torch raises its own error types when none is found
        return False


@dataclass(frozen=True)
class Decision:
    compile: bool
    reason: str


def estimate_for_run(cfg) -> tuple[bool, str]:
    """``compile=auto`` of a run on CUDA (config/spec.resolve_compile): :func:`decide` on its model, built on the
    meta device (shapes only: its FLOPs and weight matrices), and this process's GPU."""
    with torch.device("meta"):
        model = build_model(cfg, length.config_vocab(cfg))
    decision = decide(cfg, model, torch.device("cuda", local_rank() % max(1, torch.cuda.device_count())))
    return decision.compile, decision.reason


def decide(
    cfg,
    model: torch.nn.Module,
    device: torch.device,
    runs_per_graph: int = 1,
    threads: int | None = None,
    thread_flops: float | None = None,
) -> Decision:
    """Whether this run compiles: ``cfg.compile`` if true/false, else the module's rule (with the compile time
    shared by ``runs_per_graph`` runs of the same model: a claim's seeds). CPU: the run's step on ``threads``
    torch threads (None: this process's) at ``thread_flops`` per thread for the miniature (None: the profile's;
    reproduce passes the rate its estimate calibrated on this machine, reproduce/estimate.cpu_rate)."""
    if cfg.compile is not True and cfg.compile is not False and cfg.compile != "auto":
        raise ValueError(f"compile={cfg.compile!r}")  # validation.validate refuses it first
    if cfg.compile != "auto":
        return Decision(bool(cfg.compile), f"compile={str(cfg.compile).lower()}")
    if device.type == "cpu" and not has_cpp_compiler():
        return Decision(False, "compile=auto: no C++ compiler here (inductor's CPU backend needs one): eager")
    prof = PROFILES["cuda" if device.type == "cuda" else "cpu"]
    d, saving = cfg.model.d_model, prof.saving_at(cfg.model.d_model)
    if device.type == "cuda":
        flops_s = prof.eager_at(d) * (peak_flops(device, cfg.peak_flops) or UNKNOWN_GPU_PEAK)
    else:
        flops_s = prof.eager_at(d, thread_flops) * (threads or torch.get_num_threads())
    t = cfg.trainer
    tokens_per_step = t.batch_size * t.grad_accum * cfg.model.seq_len
    step_s = model_flops_per_token(model, cfg.model) * tokens_per_step / flops_s
    steps = length.run_steps(cfg, n=length.count_matrices(model))
    saved = steps * step_s * saving
    cost = prof.compile_cost(runs_per_graph)
    on = saved > cost
    shared = f" (cold {prof.compile_s:.0f} s shared by {runs_per_graph} runs, warm {prof.warm_s:.0f} s)"
    return Decision(
        on,
        f"compile=auto: {steps} steps x ~{step_s:.3g} s/step (estimated eager) x {saving:.0%} saving = "
        f"{saved:.0f} s {'>' if on else '<='} ~{cost:.0f} s of compiling on {device.type}"
        f"{shared if runs_per_graph > 1 else ''}: {'compiling' if on else 'eager'}",
    )
