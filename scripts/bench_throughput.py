"""Throughput benchmarks, measured side by side in one process and reported as ratios.

Suites (``--suite``, comma-separated; default baseline,archs,diag):
- ``baseline``: normbench's trainer (pre_ln + layernorm, nanoGPT shape) against a
  minimal plain-PyTorch GPT training loop of the same shape written below
  (nanoGPT-style: random windows, AdamW, clip, step). Target >= 0.95x.
- ``archs``: every registered architecture (``normbench.validation.ARCHS``) relative to pre_ln:
  tokens/s, model FLOP/s (tokens/s x FLOPs per token, ``normbench.runtime.flops``: a bigger MLP is
  not counted against an arch), peak memory (RSS growth of the run on CPU,
  ``torch.cuda.max_memory_allocated`` on CUDA) and the ratio of that peak to
  ``normbench.runtime.memory``'s estimate; then the share of nGPT's step spent re-normalizing weights.
- ``compile``: per architecture, eager against ``compile=true``: steady-state tokens/s and
  the compile time (the extra wall time a compiled run takes to reach its steady state,
  with a cold inductor cache); the numbers behind ``compile=auto`` (normbench/runtime/compiling.py).
- ``diag``: diag=default and diag=full (every 10 steps) against diag=off.
- ``paired``: each architecture and pre_ln built in one process and stepped in alternation
  (``--rounds`` rounds): the median of the per-round ratios and its quartiles, robust to a
  machine whose speed drifts (docs/performance.md §4).
- ``miniature``: the claims' execution mode (read from the code: a claim's baseline job as ``reproduce``
  composes it, ``compile=auto`` pinned) against eager fp32 on that job's model, in one process, in
  tokens per CPU-second over ``--rounds`` paired rounds; ends with the ratio as ``R.RRx``.
- ``forms``: every execution form (eager/compiled x fp32/bf16) of that job at 4 and 8 blocks and d 128
  and 256 (`--shapes`), paired against eager fp32; 3 seeds as one vmapped model; the fp32 and bf16 matmul rates.
``--set KEY=VALUE`` (repeatable) overrides every run of the archs, compile, diag and paired suites.
On CUDA (``--device cuda``): model gpt2_124m, bf16, optional ``--compile``, and MFU.

Each configuration runs ``--repeats`` times, interleaved (A B A B ...) so that
machine noise hits all alike; the median is reported. Timing excludes the first
``WARMUP`` steps, evaluation and checkpointing, as summary.json's tokens_per_s does.
The archs and compile suites run each training in a fresh process (``--worker``), so that
peak memory and compile time are those of that run alone.

    python scripts/bench_throughput.py                      # CPU, baseline, archs, diag
    python scripts/bench_throughput.py --suite baseline --repeats 5
    python scripts/bench_throughput.py --suite compile --archs pre_ln,ngpt
    python scripts/bench_throughput.py --suite paired --set model.d_model=512 --set model.n_head=8
    python scripts/bench_throughput.py --suite miniature --threads 1
    python scripts/bench_throughput.py --device cuda --compile --suite archs
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from bench.archs import suite_archs
from bench.baseline import suite_baseline
from bench.compiled import suite_compile
from bench.core import ARCHS, RESULT, WARMUP, quiet_logs, worker
from bench.diag import suite_diag
from bench.forms import suite_forms
from bench.miniature import suite_miniature
from bench.paired import suite_paired


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument(
        "--suite", default="baseline,archs,diag", help="comma-separated: baseline,archs,compile,diag,paired,miniature"
    )
    p.add_argument(
        "--archs", default=",".join(ARCHS), help="archs, compile and paired suites: comma-separated (default all)"
    )
    p.add_argument("--threads", type=int, default=None, help="torch threads per run (default: torch's)")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # internal: one isolated run (JSON spec)
    p.add_argument("--model", default=None, help="model config (default: small on CPU, gpt2_124m on CUDA)")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rounds", type=int, default=12, help="paired and miniature suites: alternating rounds")
    p.add_argument("--shapes", default="tiny4,tiny8,d128,d256", help="forms suite: comma-separated model shapes")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--precision", default=None, choices=["fp32", "bf16", "fp16"])
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override for every run of the archs, compile, diag and paired suites (repeatable), "
        "e.g. --set model.d_model=512 --set model.n_head=8",
    )
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
        os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the workers inherit it
    if args.worker:
        print(RESULT + json.dumps(worker(json.loads(args.worker))), flush=True)
        return 0
    args.archs = args.archs.split(",")
    if bad := [a for a in args.archs if a not in ARCHS]:
        p.error(f"unknown arch(s) {', '.join(bad)}; choose from {', '.join(ARCHS)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_throughput: error: --device cuda but no CUDA GPU is available", file=sys.stderr)
        return 2
    gpu = args.device == "cuda"
    args.model = args.model or ("gpt2_124m" if gpu else "small")
    args.batch = args.batch or (16 if gpu else 8)
    args.steps = args.steps or (50 if gpu else 40)
    args.precision = args.precision or ("bf16" if gpu else "fp32")
    if args.steps <= WARMUP:
        p.error(f"--steps {args.steps}: a run's first {WARMUP} steps are untimed; give at least {WARMUP + 2}")
    quiet_logs()
    print(
        f"# normbench throughput, device={args.device} ({torch.cuda.get_device_name() if gpu else 'CPU'}), "
        f"torch {torch.__version__}, threads {torch.get_num_threads()}"
    )
    suites = args.suite.split(",")
    if args.set and "baseline" in suites:
        p.error("--set does not apply to the baseline suite (its plain loop has a fixed shape); drop one of them")
    if args.set:
        print(f"# every run with: {' '.join(args.set)}")
    table = {
        "baseline": suite_baseline,
        "archs": suite_archs,
        "compile": suite_compile,
        "diag": suite_diag,
        "paired": suite_paired,
        "miniature": suite_miniature,
        "forms": suite_forms,
    }
    if bad := [s for s in suites if s not in table]:
        p.error(f"unknown suite(s) {', '.join(bad)}; choose from {', '.join(table)}")
    for name in suites:
        table[name](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
