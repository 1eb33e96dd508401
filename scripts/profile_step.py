"""Where a CPU training step's time goes: the model FLOP/s it reaches against the machine's matmul peak.

The issue behind it: tiny (4 blocks) trains at 40-55% of one core's fp32 matmul peak. This profiles
``--steps`` training steps (forward, backward, gradient clipping, AdamW, nGPT's re-normalization) with
``torch.profiler`` after warm-up steps, and sorts every operator's self CPU time into a few kinds:
matrix products (``mm``/``addmm``/``bmm``), attention (the SDPA kernel and its backward), elementwise and
reductions (the norms, activations, RoPE, the loss), the optimizer, and the rest (autograd and Python
dispatch, allocation). The matmul rate is the products' FLOPs (the profiler counts them) over their time;
the peak is a large fp32 product on the same threads. Plain torch.profiler: no library reads these kinds.

    python scripts/profile_step.py --set model=tiny --set model.n_layer=4 --threads 1
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

sys.path.insert(0, str(REPO / "scripts"))
from bench.paired import _stepper  # noqa: E402
from normbench.config.files import compose_config  # noqa: E402
from normbench.model import padded_vocab  # noqa: E402
from normbench.runtime.flops import model_flops_per_token  # noqa: E402

MATMUL = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear")
ATTENTION = ("scaled_dot_product", "_flash_attention", "_efficient_attention")
OPTIMIZER = ("_foreach_", "Optimizer.step", "aten::_fused_adamw")
KINDS = ("matmul", "attention", "elementwise and reductions", "optimizer", "rest")


def kind(name: str) -> str:
    if name in MATMUL:
        return "matmul"
    if any(a in name for a in ATTENTION):
        return "attention"
    if any(o in name for o in OPTIMIZER):
        return "optimizer"
    if name.startswith("aten::"):
        return "elementwise and reductions"
    return "rest"


def peak_matmul(n: int = 1024, seconds: float = 1.0) -> float:
    """FLOP/s of an n x n fp32 product on torch's threads: the machine's matmul peak, near enough."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        count += 1
    return 2 * n**3 * count / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", action="append", default=[], help="a config override (repeatable)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--top", type=int, default=12, help="list the operators with the most self CPU time")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cfg = compose_config(["diag=off", *a.set])
    model, step = _stepper(cfg, padded_vocab(cfg, 256), torch.device("cpu"), seed=0)  # the paired suite's step
    for _ in range(a.warmup):
        step()
    start = time.perf_counter()
    for _ in range(a.steps):  # the step's own time, without the profiler's per-operator overhead
        step()
    wall = (time.perf_counter() - start) / a.steps
    acts = [torch.profiler.ProfilerActivity.CPU]
    start = time.perf_counter()
    with torch.profiler.profile(activities=acts, with_flops=True) as prof:
        for _ in range(a.steps):
            step()
    profiled = (time.perf_counter() - start) / a.steps
    by_kind = dict.fromkeys(KINDS, 0.0)
    mm_flops = 0.0
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    for e in events:
        by_kind[kind(e.key)] += e.self_cpu_time_total / 1e6 / a.steps
        if kind(e.key) == "matmul":
            mm_flops += (e.flops or 0) / a.steps
    total = sum(by_kind.values())
    tokens = cfg.trainer.batch_size * cfg.model.seq_len
    model_flops = model_flops_per_token(model, cfg.model) * tokens
    peak = peak_matmul()
    print(
        f"## step profile: {' '.join(a.set) or 'defaults'}, {a.threads} thread(s), {a.steps} steps, batch "
        f"{cfg.trainer.batch_size} x {cfg.model.seq_len}"
    )
    print("| kind | ms per step | share |\n|---|---:|---:|")
    for k in KINDS:
        print(f"| {k} | {1e3 * by_kind[k]:.1f} | {100 * by_kind[k] / total:.0f}% |")
    print(f"| all (self CPU time) | {1e3 * total:.1f} | 100% |")
    print(f"\n| operator (top {a.top}) | kind | calls per step | ms per step |\n|---|---|---:|---:|")
    for e in events[: a.top]:
        ms = e.self_cpu_time_total / 1e3 / a.steps
        print(f"| `{e.key}` | {kind(e.key)} | {e.count / a.steps:.0f} | {ms:.1f} |")
    mm_rate = mm_flops / by_kind["matmul"] if by_kind["matmul"] else float("nan")
    print(
        f"\nstep wall time: {1e3 * wall:.1f} ms ({1e3 * profiled:.1f} ms under the profiler, whose per-operator "
        "overhead inflates the many small operators' rows)"
    )
    print(f"model FLOPs per step {model_flops / 1e9:.2f} G")
    print(
        f"the products take {1e3 * by_kind['matmul']:.1f} ms = {100 * by_kind['matmul'] / wall:.0f}% of the "
        f"unprofiled step; everything else {1e3 * (wall - by_kind['matmul']):.1f} ms"
    )
    print(f"model FLOP/s: {model_flops / wall / 1e9:.1f} G = {100 * model_flops / wall / peak:.0f}% of the matmul peak")
    print(f"matmul peak (1024^3 fp32 product, {a.threads} thread(s)): {peak / 1e9:.1f} GFLOP/s")
    print(
        f"the products themselves: {mm_flops / 1e9:.2f} GFLOP per step at {mm_rate / 1e9:.1f} GFLOP/s "
        f"({100 * mm_rate / peak:.0f}% of the peak)"
    )


if __name__ == "__main__":
    main()
