"""The paired suite: each architecture and pre_ln built in one process and stepped in alternation."""

from __future__ import annotations

import statistics
import time

import torch

from bench.core import WARMUP, _common, compose, padded_vocab
from normbench.data.corpus import load_data

STEPS_PER_ROUND = 2  # paired suite: steps of one model before switching to the other


def _stepper(cfg, vocab: int, device: torch.device, seed: int):
    """One training step of ``cfg``'s model: the step ``reproduce``'s paired benchmark times (claims/benchmark.py)."""
    from normbench.claims.benchmark import model_stepper

    return model_stepper(cfg, vocab, device, seed)


def suite_paired(args) -> None:
    """Each arch and pre_ln built in one process and stepped in alternation, ``--rounds`` rounds of
    two steps each (A B B A ...): the ratio is the median of the per-round ratios, so the slow drift
    of a shared or virtual machine cancels, which the one-process-per-run archs suite cannot do
    (there, the medians of a norm-free arch move by ~10% between invocations). Eager or compiled as
    ``--compile`` says; no trainer, data loading, diagnostics or evaluation: the model's own step."""
    from normbench.runtime.flops import model_flops_per_token

    device = torch.device(args.device)
    common = [o for o in _common(args) if not o.startswith("compile=")]
    ref = "pre_ln"
    ref_cfg = compose([*common, f"arch={ref}"])
    vocab = padded_vocab(ref_cfg, load_data(ref_cfg.data, log=lambda *a: None).vocab_size)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def timed(step) -> float:
        sync()
        t0 = time.perf_counter()
        for _ in range(STEPS_PER_ROUND):
            step()
        sync()
        return (time.perf_counter() - t0) / STEPS_PER_ROUND

    print(
        f"\n## paired: each arch against {ref} in one process, alternating (model={args.model}, norm=rmsnorm, "
        f"batch {args.batch}, {args.rounds} rounds x {STEPS_PER_ROUND} steps each, compile={str(args.compile).lower()})"
    )
    print(f"| arch | FLOPs/token | ms/step | tokens/s vs {ref} | quartiles | FLOP/s vs {ref} |")
    print("|---|---:|---:|---:|---:|---:|")
    for arch in [a for a in args.archs if a != ref] or [ref]:
        if args.compile:  # dynamo keeps one cache entry per model instance of GPT.forward and falls back to
            torch._dynamo.reset()  # eager past its recompile limit (8): each pair starts from an empty cache
        cfgs = {ref: ref_cfg, arch: compose([*common, f"arch={arch}"])}
        models, steps = {}, {}
        for name, cfg in cfgs.items():
            models[name], steps[name] = _stepper(cfg, vocab, device, seed=0)
            if args.compile:
                models[name].compile()
        for name in cfgs:
            for _ in range(WARMUP):
                steps[name]()
        ratios, times = [], []
        for r in range(args.rounds):
            order = (ref, arch) if r % 2 == 0 else (arch, ref)
            t = {name: timed(steps[name]) for name in order}
            ratios.append(t[ref] / t[arch])  # tokens/s of arch over ref's
            times.append(t[arch])
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        fpt = {n: model_flops_per_token(models[n], cfgs[n].model) for n in cfgs}
        print(
            f"| {arch} | {fpt[arch] / 1e6:.2f}M | {1e3 * statistics.median(times):.1f} | {q[1]:.3f} "
            f"| {q[0]:.3f}-{q[2]:.3f} | {q[1] * fpt[arch] / fpt[ref]:.3f} |",
            flush=True,
        )
        del models, steps
