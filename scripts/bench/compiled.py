"""The compile suite: per architecture, eager against ``compile=true`` with a cold and a warm inductor cache:
steady-state tokens/s and the compile time (the numbers behind ``compile=auto``)."""

from __future__ import annotations

import statistics
import tempfile

import torch

from bench.core import WARMUP, _common, isolated


def _compile_s(eager: list[dict], compiled: list[dict], timed: int) -> float:
    """The extra wall time to the compiled steady state: the wall difference plus what the timed steps saved."""
    return statistics.median(
        c["wall_s"] - e["wall_s"] + timed * (e["step_time_s"] - c["step_time_s"]) for e, c in zip(eager, compiled)
    )


def suite_compile(args) -> None:
    """Eager vs compile=true per arch, with a cold and a warm inductor cache.

    Each repeat runs eager, then compiled in a fresh cache directory (cold: the full compile), then
    compiled again in that same directory (warm: what every job of a sweep after the first gets,
    inductor's FX-graph and AOTAutograd caches being on by default). Compile time = the extra wall
    time a compiled run takes to reach its steady state; break-even = compile time / step saving."""
    archs = args.archs
    modes = ("eager", "cold", "warm")
    runs: dict[tuple[str, str], list[dict]] = {(a, m): [] for a in archs for m in modes}
    for _ in range(args.repeats):
        for arch in archs:
            runs[(arch, "eager")].append(isolated([*_common(args, False), f"arch={arch}"], args.steps))
            with tempfile.TemporaryDirectory() as cache:
                env = {"TORCHINDUCTOR_CACHE_DIR": cache}
                for m in ("cold", "warm"):
                    runs[(arch, m)].append(isolated([*_common(args, True), f"arch={arch}"], args.steps, env))
    timed = args.steps - WARMUP
    print(
        f"\n## compile: compile=true vs eager (model={args.model}, norm=rmsnorm, batch {args.batch}, "
        f"{args.steps} steps, {torch.get_num_threads() if args.threads is None else args.threads} thread(s), "
        f"median of {args.repeats}, interleaved)"
    )
    print(
        "| arch | eager tokens/s | compiled tokens/s | speed-up (wall; per CPU-s) | step saving "
        "| compile time cold / warm | break-even steps cold / warm | compiled FLOP/s vs pre_ln "
        "| peak mem compiled / eager |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    med = statistics.median
    fps, rows = {}, []
    for a in archs:
        e, c, w = ([r["summary"] for r in runs[(a, m)]] for m in modes)
        te, tc = med(s["tokens_per_s"] for s in e), med(s["tokens_per_s"] for s in c + w)
        cpu = "n/a"
        if all(s.get("cpu_tokens_per_s") for s in e + c + w):
            cpu = f"{med(s['cpu_tokens_per_s'] for s in c + w) / med(s['cpu_tokens_per_s'] for s in e):.2f}x"
        se, sc = med(s["step_time_s"] for s in e), med(s["step_time_s"] for s in c + w)
        me = med(r["peak_mem"] or 0 for r in runs[(a, "eager")])
        mc = med(r["peak_mem"] or 0 for r in runs[(a, "cold")])
        fps[a] = tc * c[0]["flops_per_token"]
        rows.append((a, te, tc, cpu, se, sc, _compile_s(e, c, timed), _compile_s(e, w, timed), me, mc))
    ref = "pre_ln" if "pre_ln" in fps else archs[0]
    for a, te, tc, cpu, se, sc, cold, warm, me, mc in rows:
        even = " / ".join(f"{t / (se - sc):,.0f}" if se > sc else "never" for t in (cold, warm))
        mem_r = f"{mc / me:.2f}" if me and mc else "n/a"
        print(
            f"| {a} | {te:,.0f} | {tc:,.0f} | {tc / te:.2f}x; {cpu} | {100 * (1 - sc / se):.0f}% | "
            f"{cold:.0f} s / {warm:.0f} s | {even} | {fps[a] / fps[ref]:.3f} | {mem_r} |"
        )
