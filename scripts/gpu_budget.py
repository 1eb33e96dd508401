"""gpu_check.sh's budget plan: each planned run's seconds by stated estimates, summed against the budget.

A run's estimate is start-up (process, data, CUDA context) + compiling (compiled runs only; the
first arch pays a cold compile, later ones share the kernel cache) + steps x the step time that
model FLOPs per token (``6N + 12 L d T``, normbench.runtime.flops, of the model built on the meta
device) x tokens per step take at an assumed MFU of the GPU's bf16 peak. The estimates are guesses
until a GPU measures them (gpu_check prints the measured compile time and MFU per arch); the run
itself skips archs by the measured times, not by this plan.
"""

from __future__ import annotations

import argparse

import torch

from normbench.config.files import compose_config
from normbench.model import build_model, padded_vocab
from normbench.runtime.flops import gpu_peak_flops, model_flops_per_token

CLAIM_TOKENS = 16 * 1024  # a claim run's step: trainer.batch_size=16 (the default) x gpt2_124m's 1024 tokens
EVAL_S = 5  # a claim run's evaluations (every 100 steps, 2 batches)


def flops_per_token(common: list[str], arch: str) -> float:
    cfg = compose_config([*common, f"arch={arch}"])
    with torch.device("meta"):
        return model_flops_per_token(build_model(cfg, padded_vocab(cfg, 50257)), cfg.model)


def plan(a: argparse.Namespace) -> tuple[list[tuple[str, float, str, bool]], float]:
    """The rows (run, seconds, how the seconds add up, whether it runs whatever the budget) and the peak."""
    peak = (float(a.gpu) if a.gpu[0].isdigit() else gpu_peak_flops(a.gpu) or 100e12) * a.nproc
    tokens, common = a.batch * a.accum * 1024, a.common.split()
    f0 = flops_per_token(common, a.first)
    step = tokens * f0 / (peak * a.mfu)
    rows = [(a.first, a.start + a.compile + a.steps * step,
             f"start {a.start:.0f} + compile {a.compile:.0f} + {a.steps} x {step:.2f} s", True)]  # fmt: skip
    if a.eager:
        e = tokens * f0 / (peak * a.eager_mfu)
        rows.append(
            ("pre_ln_eager", a.start + a.steps * e, f"start {a.start:.0f} + {a.steps} x {e:.2f} s, eager", True)
        )
    if a.claim:
        c = CLAIM_TOKENS * f0 / (peak * a.eager_mfu)  # the claim's own settings: eager
        how = f"2 runs x (start {a.start:.0f} + {a.claim_steps} x {c:.3f} s + evals {EVAL_S})"
        rows.append((f"claim {a.claim}", 2 * (a.start + a.claim_steps * c + EVAL_S), how, True))
    for arch in a.rest.split():
        step = tokens * flops_per_token(common, arch) / (peak * a.mfu)
        how = f"start {a.start:.0f} + compile {a.compile_next:.0f} + {a.steps} x {step:.2f} s"
        rows.append((arch, a.start + a.compile_next + a.steps * step, how, False))
    return rows, peak


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--first", required=True)
    p.add_argument("--rest", default="")
    p.add_argument("--eager", action="store_true")
    p.add_argument("--claim", default="")
    p.add_argument("--common", required=True, help="the Hydra overrides every arch run shares")
    p.add_argument("--gpu", default="H200", help="a GPU name of normbench's peak table, or a peak in FLOP/s")
    for name, kind, default in [("budget", int, 480), ("steps", int, 50), ("batch", int, 32), ("accum", int, 2),
                                ("nproc", int, 1), ("claim-steps", int, 300), ("start", float, 15.0),
                                ("compile", float, 60.0), ("compile-next", float, 35.0), ("mfu", float, 0.40),
                                ("eager-mfu", float, 0.25)]:  # fmt: skip
        p.add_argument(f"--{name}", type=kind, default=default)
    a = p.parse_args()
    rows, peak = plan(a)
    print(f"gpu_check: budget plan, BUDGET_S={a.budget} s on {a.gpu} ({peak / 1e12:.0f} TFLOP/s bf16; estimates: "
          f"compiled MFU {a.mfu:.0%}, eager {a.eager_mfu:.0%}, compile {a.compile:.0f} s cold / {a.compile_next:.0f} s "
          "next; measured times decide)")  # fmt: skip
    total, over = 0.0, 0
    for name, sec, how, always in rows:
        total += sec
        fits = total <= a.budget
        over += not fits and not always
        mark = "fits" if fits else ("over budget: runs anyway" if always else "over budget: skipped")
        print(f"gpu_check:   {name:<22} {sec:6.0f} s  total {total:6.0f} s  {mark}  ({how})")
    verdict = "fits" if total <= a.budget else f"does not fit: {over} run(s) skipped by this estimate"
    print(f"gpu_check: budget plan: {total:.0f} s for {len(rows)} runs, {verdict} (BUDGET_S={a.budget} s)")


if __name__ == "__main__":
    main()
