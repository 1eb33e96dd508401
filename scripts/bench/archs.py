"""The archs suite: every registered architecture relative to pre_ln (tokens/s, model FLOP/s, peak memory and
its ratio to the estimate), each run isolated; then the share of nGPT's step spent re-normalizing weights."""

from __future__ import annotations

import statistics
import time

import torch

from bench.core import WARMUP, _common, _mb, compose, isolated


def suite_archs(args) -> None:
    archs = args.archs
    common = _common(args)
    results: dict[str, list[dict]] = {a: [] for a in archs}
    for _ in range(args.repeats):
        for arch in archs:
            results[arch].append(isolated([*common, f"arch={arch}"], args.steps))

    def med(arch, fn):
        vals = [v for v in (fn(r) for r in results[arch]) if v is not None]
        return statistics.median(vals) if vals else None

    tps = {a: med(a, lambda r: r["summary"]["tokens_per_s"]) for a in archs}
    cpu = {a: med(a, lambda r: r["summary"].get("cpu_tokens_per_s")) for a in archs}
    fps = {a: med(a, lambda r: r["summary"]["tokens_per_s"] * r["summary"]["flops_per_token"]) for a in archs}
    mem = {a: med(a, lambda r: r["peak_mem"]) for a in archs}
    ref = "pre_ln" if "pre_ln" in archs else archs[0]
    what = "peak RSS growth" if args.device == "cpu" else "max_memory_allocated"
    print(
        f"\n## archs: relative to {ref} (model={args.model}, norm=rmsnorm, batch {args.batch}, {args.steps} steps, "
        f"compile={str(args.compile).lower()}, median of {args.repeats}, interleaved)"
    )
    print(
        f"| arch | params | FLOPs/token | tokens/s | tokens/s vs {ref} | FLOP/s vs {ref} | MFU | peak mem ({what}) "
        f"| mem vs {ref} | measured / estimate |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    cpu_rows = []
    for a in archs:
        s0 = results[a][0]["summary"]
        mfu = med(a, lambda r: r["summary"].get("mfu"))
        mfu_s = f"{100 * mfu:.1f}%" if mfu else "n/a"
        mem_r = f"{mem[a] / mem[ref]:.2f}" if mem[a] and mem[ref] else "n/a"
        est = results[a][0]["mem_estimate"]
        est_r = f"{mem[a] / est:.2f}" if mem[a] else "n/a"
        print(
            f"| {a} | {s0['n_params']:,} | {s0['flops_per_token'] / 1e6:.2f}M | {tps[a]:,.0f} | "
            f"{tps[a] / tps[ref]:.3f} | {fps[a] / fps[ref]:.3f} | {mfu_s} | {_mb(mem[a])} | {mem_r} | {est_r} |"
        )
        if cpu[a] and cpu[ref]:
            flops_r = results[a][0]["summary"]["flops_per_token"] / results[ref][0]["summary"]["flops_per_token"]
            cpu_rows.append(f"| {a} | {cpu[a]:,.0f} | {cpu[a] / cpu[ref]:.3f} | {flops_r * cpu[a] / cpu[ref]:.3f} |")
    if cpu_rows:
        print("\nSame runs, per CPU-second of the steady-state steps (load-robust with one thread):")
        print(f"| arch | tokens/CPU-s | tokens vs {ref} | FLOPs vs {ref} |\n|---|---:|---:|---:|")
        print("\n".join(cpu_rows))
    if "ngpt" in archs:
        renorm_share(args)


def renorm_share(args) -> None:
    """Share of an nGPT training step spent in normalize_matrices (on the `small` model)."""
    from normbench.model import build_model

    cfg = compose(["model=small", "arch=ngpt", f"device={args.device}"])
    device = torch.device(args.device)
    model = build_model(cfg, 256).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 256, (args.batch, cfg.model.seq_len + 1), device=device)
    step_t, renorm_t = [], []
    for i in range(args.steps):
        t0 = time.perf_counter()
        _, loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad()
        if device.type == "cuda":
            torch.cuda.synchronize()
        t1 = time.perf_counter()
        model.normalize_matrices()
        if device.type == "cuda":
            torch.cuda.synchronize()
        t2 = time.perf_counter()
        if i >= WARMUP:
            step_t.append(t2 - t0)
            renorm_t.append(t2 - t1)
    share = sum(renorm_t) / sum(step_t)
    print(
        f"\nnGPT weight re-normalization: {1e3 * statistics.median(renorm_t):.2f} ms of "
        f"{1e3 * statistics.median(step_t):.1f} ms per step = {100 * share:.1f}% of step time (model=small)"
    )
