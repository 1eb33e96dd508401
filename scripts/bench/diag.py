"""The diag suite: diag=default and diag=full (every 10 steps) against diag=off."""

from __future__ import annotations

from bench.core import interleaved, normbench_run


def suite_diag(args) -> None:
    common = [
        f"model={args.model}",
        "arch=pre_ln",
        "norm=rmsnorm",
        f"trainer.batch_size={args.batch}",
        f"device={args.device}",
        f"precision={args.precision}",
        *args.set,
    ]
    res = interleaved(
        {
            name: (
                lambda name=name: normbench_run([*common, f"diag={name}", "diag.every=10"], args.steps)["tokens_per_s"]
            )
            for name in ("off", "default", "full")
        },
        args.repeats,
    )
    print(
        f"\n## diag: throughput with diagnostics every 10 steps vs off (model={args.model}, median of {args.repeats})"
    )
    print("| diag | tokens/s | vs off | cost |\n|---|---:|---:|---:|")
    for name, tps in res.items():
        r = tps / res["off"]
        print(f"| {name} | {tps:,.0f} | {r:.3f} | {100 * (1 - r):.1f}% |")
