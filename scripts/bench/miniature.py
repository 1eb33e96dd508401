"""The miniature suite: the claims' execution mode against eager fp32, side by side in one process, in
tokens per CPU-second (one torch thread: the rate hardly depends on what else the machine runs, where
tokens per wall-second does).

The claims' mode is read from the code, not written here: :data:`CLAIM`'s baseline job at scale cpu, composed
as ``reproduce`` composes it (the claims' mode, claims/registry.CPU_MODE, with its tokens per parameter and
``compile=auto`` pinned, reproduce/plan.py): its ``compile``, ``precision`` and ``attn_fp32`` are the mode
every claim job trains in."""

from __future__ import annotations

import copy
import os
import statistics
import time

import torch

from bench.core import WARMUP, padded_vocab
from bench.paired import _stepper
from normbench.data.corpus import load_data

CLAIM = "rmsnorm_parity"  # its baseline job is the miniature: Pre-LN + LayerNorm, tiny, 4 blocks, batch 16
STEPS_PER_ROUND = 3


def claims_job(overrides=()) -> tuple[object, str]:
    """(composed config, reason) of :data:`CLAIM`'s baseline job as ``reproduce`` would train it at scale cpu."""
    from pathlib import Path

    from normbench.claims.registry import load_claim
    from normbench.reproduce.length import baseline_job
    from normbench.reproduce.plan import build

    claim = load_claim(CLAIM)
    p = build(claim, "cpu", None, list(overrides), Path("outputs/reproduce"), log=lambda *a: None)
    _, cfg = baseline_job(claim, "cpu", p.users, p.pairs)
    return cfg, p.mode.reason if p.mode else f"compile={str(cfg.compile).lower()}"


def mode_name(cfg) -> str:
    from normbench.runtime.precision import precision_name

    return f"{'compiled' if cfg.compile is True else 'eager'} {precision_name(cfg)}"


def with_mode(cfg, compile_: bool, precision: str, attn_fp32: bool = False, **model):
    """A copy of ``cfg`` (a composed config) in another execution mode, with ``model`` fields set (n_layer=8)."""
    out = copy.deepcopy(cfg)
    out.compile, out.precision, out.attn_fp32 = compile_, precision, attn_fp32
    for key, value in model.items():
        out.model[key] = value
    return out


class Form:
    """One execution form of one config, built and warmed up: ``step()`` trains one step of ``tokens``."""

    def __init__(self, name: str, step, tokens: int, flops_per_token: float):
        self.name, self.step, self.tokens, self.flops_per_token = name, step, tokens, flops_per_token


def build_form(name: str, cfg, vocab: int, wrap=None) -> Form:
    """``cfg``'s model and step (``wrap(step)`` where given), compiled if ``cfg.compile`` is true, warmed up."""
    from normbench.runtime.flops import model_flops_per_token

    model, step = _stepper(cfg, vocab, torch.device("cpu"), seed=0)
    step = wrap(step) if wrap else step
    if cfg.compile is True:
        model.compile()  # as the trainer's torch.compile(model): the forward, autocast outside it
    for _ in range(WARMUP):
        step()
    tokens = cfg.trainer.batch_size * cfg.model.seq_len
    return Form(name, step, tokens, model_flops_per_token(model, cfg.model))


def cpu_seconds(step, n: int) -> float:
    t0 = time.process_time()
    for _ in range(n):
        step()
    return (time.process_time() - t0) / n


def paired_rates(forms: list[Form], rounds: int, steps: int = STEPS_PER_ROUND) -> dict[str, dict]:
    """Every form stepped in turn, ``rounds`` rounds (the order rotated each round): per form its median
    tokens per CPU-second and the per-round ratios to ``forms[0]``'s (median, quartiles)."""
    rates: dict[str, list[float]] = {f.name: [] for f in forms}
    for r in range(rounds):
        for f in forms[r % len(forms) :] + forms[: r % len(forms)]:
            rates[f.name].append(f.tokens / cpu_seconds(f.step, steps))
    ref = rates[forms[0].name]
    out = {}
    for f in forms:
        ratios = [a / b for a, b in zip(rates[f.name], ref)]
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
        rate = statistics.median(rates[f.name])
        out[f.name] = {"rate": rate, "ratio": q[1], "low": q[0], "high": q[2], "gflops": rate * f.flops_per_token / 1e9}
    return out


def load() -> str:
    return "load average " + " / ".join(f"{v:.2f}" for v in os.getloadavg()) + f" on {os.cpu_count()} cores"


def suite_miniature(args) -> None:
    """The claims' mode against eager fp32 on the miniature, ``--rounds`` rounds of paired CPU-time steps."""
    cfg, reason = claims_job(args.set)
    vocab = padded_vocab(cfg, load_data(cfg.data, log=lambda *a: None).vocab_size)
    claims = mode_name(cfg)
    eager = with_mode(cfg, False, "fp32")
    where = f"{cfg.model.name}, {cfg.model.n_layer} blocks"
    print(f"\n## miniature: the claims' mode ({claims}; {reason}) against eager fp32 ({where}, d {cfg.model.d_model})")
    print(f"# {CLAIM}'s baseline job, batch {cfg.trainer.batch_size}, {torch.get_num_threads()} thread(s); {load()}")
    if claims == "eager fp32":
        print("# the claims' mode is eager fp32 itself: nothing to time")
        print(f"miniature: claims' mode 1.00x eager fp32 ({where})")
        return
    torch._dynamo.reset()
    forms = [build_form("eager fp32", eager, vocab), build_form(claims, cfg, vocab)]
    res = paired_rates(forms, args.rounds)
    for name, r in res.items():
        print(
            f"| {name} | {r['rate']:,.0f} tokens/CPU-s | {r['gflops']:.1f} GFLOP/s | {r['ratio']:.3f} "
            f"[{r['low']:.3f}, {r['high']:.3f}] |"
        )
    print(f"# {load()}")
    print(f"miniature: claims' mode {res[claims]['ratio']:.2f}x eager fp32 ({where})")
