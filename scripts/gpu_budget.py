"""gpu_check.sh's budget plan: each planned run's seconds by stated estimates, summed against the budget.

A run's estimate is start-up (process, data, CUDA context) + compiling (compiled runs only; the
first arch pays a cold compile, later ones share the kernel cache) + steps x the step time that
model FLOPs per token (``6N + 12 L d T``, normbench.runtime.flops, of the model built on the meta
device) x tokens per step take at an assumed MFU of the GPU's bf16 peak. The estimates are guesses
until a GPU measures them (gpu_check prints the measured compile time and MFU per arch); the run
itself skips archs by the measured times, not by this plan.

With ``--sweep eager --fit-steps`` (gpu_check's plan) the archs after the first run eager, as does
the eager reference, at the most steps (at most ``--steps``, at least ``--min-steps``) that fit the
budget left after the fixed runs: compiling costs 35-60 s per arch, more than a whole eager run.
``--standard-flops`` costs every arch as a standard GPT block of the model's shape (from
conf/model, no torch needed): the plan of a machine where normbench is not installed yet.
"""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CLAIM_TOKENS = 16 * 1024  # a claim run's step: trainer.batch_size=16 (the default) x gpt2_124m's 1024 tokens
EVAL_S = 5  # a claim run's evaluations (every 100 steps, 2 batches)
DDP_STEPS = 10  # the DDP smoke run's steps (gpu_check.sh), eager
H100_PEAK = 989e12  # --standard-flops without normbench's peak table: H100 SXM/H200 (normbench.runtime.flops)
GPT2_VOCAB = 50304  # the GPT-2 BPE's 50257 padded to a multiple of 64 (normbench.model.padded_vocab)


def standard_flops(common: list[str]) -> float:
    """``6N + 12 L d T`` of a standard GPT block (attention 4d^2, MLP 8d^2) and a tied LM head, for the
    ``model=`` of ``common`` read from conf/model/NAME.yaml."""
    name = next((o.split("=", 1)[1] for o in common if o.startswith("model=")), "small")
    keys = dict(re.findall(r"^(\w+):\s*(\d+)", (REPO / "conf" / "model" / f"{name}.yaml").read_text(), re.M))
    n_layer, d, t = int(keys["n_layer"]), int(keys["d_model"]), int(keys["seq_len"])
    return 6.0 * (12 * n_layer * d * d + d * GPT2_VOCAB) + 12.0 * n_layer * d * t


def flops_per_token(common: list[str], arch: str, standard: bool) -> float:
    if standard:
        return standard_flops(common)
    import torch

    from normbench.config.files import compose_config
    from normbench.model import build_model, padded_vocab
    from normbench.runtime.flops import model_flops_per_token

    cfg = compose_config([*common, f"arch={arch}"])
    with torch.device("meta"):
        return model_flops_per_token(build_model(cfg, padded_vocab(cfg, 50257)), cfg.model)


def peak_of(a: argparse.Namespace) -> float:
    if a.gpu[0].isdigit():
        return float(a.gpu) * a.nproc
    if a.standard_flops:
        return H100_PEAK * a.nproc
    from normbench.runtime.flops import gpu_peak_flops

    return (gpu_peak_flops(a.gpu) or 100e12) * a.nproc


def sweep_steps(a, fixed: float, steps: list[float], per_run: float) -> int:
    """The sweep's steps: ``--steps``, or with ``--fit-steps`` the most that fit what the fixed runs leave."""
    if not a.fit_steps or not steps:
        return a.steps
    room = a.budget - fixed - len(steps) * per_run
    return max(a.min_steps, min(a.steps, math.floor(room / sum(steps)))) if room > 0 else a.min_steps


def plan(a: argparse.Namespace) -> tuple[list[tuple[str, float, str, bool]], float, int]:
    """The rows (run, seconds, how the seconds add up, whether it runs whatever the budget), the peak and the
    sweep's steps."""
    peak = peak_of(a)
    tokens, common = a.batch * a.accum * 1024, a.common.split()
    f0 = flops_per_token(common, a.first, a.standard_flops)
    step = tokens * f0 / (peak * a.mfu)
    eager = tokens * f0 / (peak * a.eager_mfu)
    rows = [
        (
            a.first,
            a.start + a.compile + a.steps * step,
            f"start {a.start:.0f} + compile {a.compile:.0f} + {a.steps} x {step:.2f} s",
            True,
        )
    ]
    if a.claim:
        c = CLAIM_TOKENS * f0 / (peak * a.eager_mfu)  # the claim's own settings: eager
        how = f"2 runs x (start {a.start:.0f} + {a.claim_steps} x {c:.3f} s + evals {EVAL_S})"
        rows.append((f"claim {a.claim}", 2 * (a.start + a.claim_steps * c + EVAL_S), how, True))
    if a.ddp:  # 2 processes: each takes half of a step's micro-batches
        rows.append(
            (
                "ddp_smoke",
                a.start + DDP_STEPS * eager / 2,
                f"start {a.start:.0f} + {DDP_STEPS} x {eager / 2:.2f} s, eager, 2 GPUs",
                True,
            )
        )
    compiled = a.sweep == "compiled"
    sweep = [("pre_ln_eager", eager, "eager", True)] if a.eager else []
    for arch in a.rest.split():
        s = tokens * flops_per_token(common, arch, a.standard_flops) / (peak * (a.mfu if compiled else a.eager_mfu))
        sweep.append((arch, s, "compiled" if compiled else "eager", False))
    per_run = a.start + (a.compile_next if compiled else 0)
    fixed = sum(r[1] for r in rows)
    n = sweep_steps(a, fixed, [s for _, s, _, _ in sweep], per_run)
    for name, s, mode, always in sweep:
        warm = mode == "compiled" and name != "pre_ln_eager"
        start = f"start {a.start:.0f}" + (f" + compile {a.compile_next:.0f}" if warm else "")
        rows.append((name, a.start + (a.compile_next if warm else 0) + n * s, f"{start} + {n} x {s:.2f} s", always))
    # the first run, the eager reference, the claim (and DDP) in gpu_check's order, then the sweep
    order = {"pre_ln_eager": 1}
    rows.sort(key=lambda r: 0 if r[0] == a.first else order.get(r[0], 2 if r[3] else 3))
    return rows, peak, n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--first", required=True)
    p.add_argument("--rest", default="")
    p.add_argument("--eager", action="store_true", help="the eager reference run of the first arch")
    p.add_argument("--claim", default="")
    p.add_argument("--ddp", action="store_true", help="the 2-GPU DDP smoke run")
    p.add_argument("--common", required=True, help="the Hydra overrides every arch run shares")
    p.add_argument("--gpu", default="H200", help="a GPU name of normbench's peak table, or a peak in FLOP/s")
    p.add_argument(
        "--sweep", choices=["compiled", "eager"], default="compiled", help="how the archs after the first run"
    )
    p.add_argument("--fit-steps", action="store_true", help="the sweep's steps: as many as fit the budget")
    p.add_argument("--standard-flops", action="store_true", help="every arch costed as a standard GPT block")
    for name, kind, default in [
        ("budget", int, 480),
        ("steps", int, 50),
        ("min-steps", int, 15),
        ("batch", int, 32),
        ("accum", int, 2),
        ("nproc", int, 1),
        ("claim-steps", int, 300),
        ("start", float, 15.0),
        ("compile", float, 60.0),
        ("compile-next", float, 35.0),
        ("mfu", float, 0.40),
        ("eager-mfu", float, 0.25),
    ]:
        p.add_argument(f"--{name}", type=kind, default=default)
    a = p.parse_args()
    rows, peak, n = plan(a)
    how = "every arch costed as a standard GPT block (normbench not installed here)" if a.standard_flops else ""
    print(
        f"gpu_check: budget plan, BUDGET_S={a.budget} s on {a.gpu} ({peak / 1e12:.0f} TFLOP/s bf16; estimates: "
        f"compiled MFU {a.mfu:.0%}, eager {a.eager_mfu:.0%}, compile {a.compile:.0f} s cold / {a.compile_next:.0f} s "
        f"next{'; ' + how if how else ''}; measured times decide)"
    )
    total, over = 0.0, 0
    for name, sec, how, always in rows:
        total += sec
        fits = total <= a.budget
        over += not fits and not always
        mark = "fits" if fits else ("over budget: runs anyway" if always else "over budget: skipped")
        print(f"gpu_check:   {name:<22} {sec:6.0f} s  total {total:6.0f} s  {mark}  ({how})")
    verdict = "fits" if total <= a.budget else f"does not fit: {over} run(s) skipped by this estimate"
    print(f"gpu_check: budget plan: {total:.0f} s for {len(rows)} runs, {verdict} (BUDGET_S={a.budget} s)")
    if a.fit_steps:
        print(
            f"gpu_check: budget plan: the arch sweep {a.sweep} at sweep_steps={n} (of STEPS={a.steps}, at least "
            f"{a.min_steps}), the first arch compiled at {a.steps}"
        )


if __name__ == "__main__":
    main()
