"""The forms suite: every execution form of the miniature against eager fp32 (paired, tokens per CPU-second),
several seeds as one batched model (``torch.func.stack_module_state`` + ``vmap``) against the same seeds
stepped one after another, and the core's fp32 and bf16 matrix-product rates at the miniature's shapes.
The numbers behind docs/performance.md §7; a measurement, not a trainer feature."""

from __future__ import annotations

import copy
import time
import warnings

import torch

from bench.core import padded_vocab
from bench.miniature import build_form, claims_job, cpu_seconds, load, paired_rates, with_mode
from normbench.data.corpus import load_data

SHAPES = {
    "tiny4": ("tiny, 4 blocks", {}),
    "tiny8": ("tiny, 8 blocks", {"n_layer": 8}),
    "d128": ("d 128", {"d_model": 128}),
    "d256": ("d 256", {"d_model": 256}),
}
# (compile, precision, attn_fp32): the fp32-attention forms are the trainer's own attn_fp32 (model/attention.sdpa)
FORMS = {
    "eager fp32": (False, "fp32", False),
    "compiled fp32": (True, "fp32", False),
    "compiled bf16": (True, "bf16", False),
    "eager bf16": (False, "bf16", False),
    "compiled bf16, fp32 attention": (True, "bf16", True),
    "eager bf16, fp32 attention": (False, "bf16", True),
}
SEEDS = 3  # a claim's seeds: one batched model of this many
MATMULS = [(1024, 64, 256), (1024, 256, 64), (1024, 128, 512), (1024, 256, 1024), (1024, 1024, 1024)]


def matmul_rate(m: int, k: int, n: int, dtype, seconds: float = 0.3) -> float:
    """GFLOP/s of ``(m x k) @ (k x n)`` in ``dtype`` on this thread: the best of three ~``seconds`` bursts."""
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    best = 0.0
    for _ in range(3):
        reps, t0 = 0, time.process_time()
        while (dt := time.process_time() - t0) < seconds / 3:
            a @ b
            reps += 1
        best = max(best, 2 * m * k * n * reps / dt / 1e9)
    return best


def stacked_step(cfg, vocab: int, seeds: int):
    """One AdamW step of ``seeds`` copies of ``cfg``'s model (seeds 0..) as one vmapped model; per-seed
    gradient clipping. Weight decay on the stacked matrices (the elementwise update costs the same)."""
    from torch.func import functional_call, stack_module_state

    from normbench.model import build_model

    models = []
    for s in range(seeds):
        torch.manual_seed(s)
        models.append(build_model(cfg, vocab))
    params, buffers = stack_module_state(models)
    base = copy.deepcopy(models[0])  # on meta, a weight the forward reads directly would stay there
    from normbench.config.spec import spec_of

    o = cfg.optim
    decay = [p for p in params.values() if p.ndim >= 3]
    rest = [p for p in params.values() if p.ndim < 3]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": o.weight_decay}, {"params": rest, "weight_decay": 0.0}],
        lr=spec_of(cfg).lr,
        betas=tuple(o.betas),
        eps=o.eps,  # optim.lr=auto resolved as the trainer does
    )
    batch = torch.randint(0, vocab, (seeds, cfg.trainer.batch_size, cfg.model.seq_len + 1))
    clip = cfg.trainer.grad_clip

    def loss_of(p, b, x, y):
        return functional_call(base, (p, b), (x, y))[1]

    def step() -> None:
        losses = torch.vmap(loss_of)(params, buffers, batch[..., :-1], batch[..., 1:])
        losses.sum().backward()
        grads = [p.grad for p in params.values()]
        norms = torch.stack([g.flatten(1).pow(2).sum(1) for g in grads]).sum(0).sqrt()
        scale = (clip / (norms + 1e-6)).clamp(max=1.0)
        for g in grads:
            g.mul_(scale.view(-1, *[1] * (g.ndim - 1)))
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _forms_table(cfg, vocab: int, rounds: int, shapes: list[str]) -> None:
    print("| config | form | tokens/CPU-s | ratio to eager fp32 [quartiles] | GFLOP/s | of fp32 peak | of bf16 peak |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for key in shapes:
        shape, model = SHAPES[key]
        torch._dynamo.reset()  # dynamo's per-code recompile limit: each config starts from an empty cache
        forms = [build_form(f, with_mode(cfg, c, p, a, **model), vocab) for f, (c, p, a) in FORMS.items()]
        for name, r in paired_rates(forms, rounds).items():
            print(
                f"| {shape} | {name} | {r['rate']:,.0f} | {r['ratio']:.2f} [{r['low']:.2f}, {r['high']:.2f}] "
                f"| {r['gflops']:.1f} | {r['gflops'] / PEAK['fp32']:.0%} | {r['gflops'] / PEAK['bf16']:.0%} |",
                flush=True,
            )
        print(f"# after {shape}: {load()}", flush=True)


PEAK: dict[str, float] = {}


def suite_forms(args) -> None:
    shapes = args.shapes.split(",")
    if bad := [s for s in shapes if s not in SHAPES]:
        raise SystemExit(f"bench_throughput: error: unknown --shapes {', '.join(bad)}; choose from {', '.join(SHAPES)}")
    warnings.filterwarnings("ignore", message=".*batching rule")  # SDPA has none: vmap loops it per seed
    cfg, _ = claims_job(args.set)
    vocab = padded_vocab(cfg, load_data(cfg.data, log=lambda *a: None).vocab_size)
    print(f"\n## forms: the miniature's execution forms, {torch.get_num_threads()} thread(s); {load()}")
    print("| matmul (m x k @ k x n) | fp32 GFLOP/s | bf16 GFLOP/s | bf16 / fp32 |")
    print("|---|---:|---:|---:|")
    for m, k, n in MATMULS:
        f32, b16 = matmul_rate(m, k, n, torch.float32), matmul_rate(m, k, n, torch.bfloat16)
        print(f"| {m}x{k} @ {k}x{n} | {f32:.1f} | {b16:.1f} | {b16 / f32:.2f} |", flush=True)
    PEAK.update(fp32=f32, bf16=b16)  # the fat product's: the core's peak
    _forms_table(cfg, vocab, args.rounds, shapes)
    eager = with_mode(cfg, False, "fp32")
    stacked = stacked_step(eager, vocab, SEEDS)
    seq = [build_form(f"seed {s}", eager, vocab).step for s in range(SEEDS)]
    tokens = SEEDS * cfg.trainer.batch_size * cfg.model.seq_len
    for _ in range(2):
        stacked()
    ratios = []
    for _ in range(args.rounds):
        t_seq = sum(cpu_seconds(s, 2) for s in seq)
        ratios.append(t_seq / cpu_seconds(stacked, 2))
    ratios.sort()
    print(
        f"\nvmap: {SEEDS} seeds as one stacked model vs one after another (tiny, 4 blocks, eager fp32): "
        f"{ratios[len(ratios) // 2]:.2f}x [{ratios[len(ratios) // 4]:.2f}, {ratios[3 * len(ratios) // 4]:.2f}] "
        f"per CPU-second ({tokens / SEEDS:,.0f} tokens per seed per step); {load()}"
    )
