"""``compile=true|false|auto``: when ``torch.compile`` pays for itself.

``torch.compile`` (inductor) makes a training step faster but costs a one-off compile at
the first training step and at the first evaluation (a second, no-grad graph). It is worth
it when the run is long enough for the per-step saving to repay that time:

    compile  <=>  steps x (estimated eager step time) x SAVING  >  COMPILE_S

- estimated eager step time = model FLOPs per optimizer step (``6N + 12LdT`` per token,
  :mod:`normbench.train.flops`, times tokens per step) / the eager FLOP/s the device reaches;
- ``SAVING``: the fraction of the eager step time compile removes;
- ``COMPILE_S``: seconds of compiling (both graphs) before the run reaches its steady state.

The constants per device type are in :data:`PROFILES` (sources in docs/performance.md §3).
CPU: eager model FLOP/s per torch thread from the torch.profiler run of ``model=small`` Pre-LN
(about 1e10, on a loaded machine, so on the low side), the saving of the Pre-LN compile speed-up
measured when compile=true was added (1.22x, i.e. 18%; nGPT's 1.40x saves more), and the upper
end of the 20-60 s compile times seen for small models. CUDA: nothing measured yet (no GPU was
lent when this was written): the eager throughput is taken as 25% of the bf16 peak
(:func:`flops.peak_flops`, or 100 TFLOP/s for an unknown GPU), the saving as 30% (nanoGPT
reports 250 -> 135 ms per step for GPT-2 124M, i.e. 46%; 30% is on the safe side) and the
compile time as 90 s (about a minute per graph for gpt2_124m). ``scripts/gpu_check.sh`` prints
the compile time per arch and Pre-LN's compile speed-up on a GPU, so that row can be replaced
by measurements.

The rule is an estimate, logged with its numbers at start-up; ``compile=true`` and
``compile=false`` bypass it. The default stays ``false``: a compiled run's losses agree with
eager mode to ~1e-3 relative, not bit for bit, and a default that changed with the run's
length would make short and long runs differ in that way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from normbench.train import length
from normbench.train.flops import model_flops_per_token, peak_flops

CHOICES = (True, False, "auto")


@dataclass(frozen=True)
class Profile:
    eager_flops: float  # model FLOP/s an eager step reaches (CPU: per thread; CUDA: fraction of peak)
    saving: float  # fraction of the eager step time that compile removes
    compile_s: float  # seconds of compiling before the steady state


PROFILES = {
    # 2-core CPU, model=small, torch 2.13 (module docstring; docs/performance.md §3)
    "cpu": Profile(eager_flops=1.0e10, saving=0.18, compile_s=60.0),
    # assumptions until measured on a GPU (module docstring)
    "cuda": Profile(eager_flops=0.25, saving=0.30, compile_s=90.0),
}
UNKNOWN_GPU_PEAK = 100e12  # FLOP/s assumed for a GPU the peak table does not know


@dataclass(frozen=True)
class Decision:
    compile: bool
    reason: str


def decide(cfg, model: torch.nn.Module, device: torch.device) -> Decision:
    """Whether this run compiles: ``cfg.compile`` if true/false, else the module's rule."""
    if cfg.compile is not True and cfg.compile is not False and cfg.compile != "auto":
        raise ValueError(f"compile={cfg.compile!r}")  # validation.validate refuses it first
    if cfg.compile != "auto":
        return Decision(bool(cfg.compile), f"compile={str(cfg.compile).lower()}")
    prof = PROFILES["cuda" if device.type == "cuda" else "cpu"]
    if device.type == "cuda":
        flops_s = prof.eager_flops * (peak_flops(device, cfg.peak_flops) or UNKNOWN_GPU_PEAK)
    else:
        flops_s = prof.eager_flops * torch.get_num_threads()
    t = cfg.trainer
    tokens_per_step = t.batch_size * t.grad_accum * cfg.model.seq_len
    step_s = model_flops_per_token(model, cfg.model) * tokens_per_step / flops_s
    steps = length.run_steps(cfg, n=length.count_matrices(model))
    saved = steps * step_s * prof.saving
    on = saved > prof.compile_s
    return Decision(
        on,
        f"compile=auto: {steps} steps x ~{step_s:.3g} s/step (estimated eager) x {prof.saving:.0%} saving = "
        f"{saved:.0f} s {'>' if on else '<='} ~{prof.compile_s:.0f} s of compiling on {device.type}: "
        f"{'compiling' if on else 'eager'}",
    )
