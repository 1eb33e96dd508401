"""The LR-transfer sweep of docs/mup.md: best val loss against the AdamW LR, one curve per width, SP and muP.

Under the standard parametrization the best LR moves with width; under muP (``model.param=mup``,
model/mup.py) it should stay within a grid step (Yang et al. 2022, arXiv:2203.03466, Fig. 1). Each point
is an ordinary ``normbench train`` run in ``OUT/<arch>/<param>/d<width>/lr<lr>/s<seed>`` (skipped when its
summary exists, so the sweep resumes); d_head is held at 16, so the head count grows with the width.

    python scripts/mup_lr_transfer.py run --param sp --widths 128 256 --lrs 1e-3 2e-3 --out outputs/lrsweep
    python scripts/mup_lr_transfer.py plot --out outputs/lrsweep --png docs/img/mup_lr_transfer.png
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

D_HEAD = 16
BASE_WIDTH = 64  # model.mup_base_width's default
TOP = 2.1  # the figure's loss ceiling: worse (and diverged) points are drawn on it
FIXED = [
    "model=tiny",
    "model.n_layer=4",
    "norm=layernorm",
    "trainer.max_steps=200",
    "trainer.eval_every=50",
    "diag.every=1000",
    "trainer.ckpt_every=1000",
]


def run_dir(out: Path, arch: str, param: str, width: int, lr: float, seed: int) -> Path:
    return out / arch / param / f"d{width}" / f"lr{lr:.3g}" / f"s{seed}"


def run_point(out: Path, arch: str, param: str, width: int, lr: float, seed: int, extra: list[str]) -> dict:
    where = run_dir(out, arch, param, width, lr, seed)
    summary = where / "summary.json"
    if not summary.exists():
        args = [
            *FIXED,
            f"arch={arch}",
            f"model.param={param}",
            f"model.d_model={width}",
            f"model.n_head={width // D_HEAD}",
            f"optim.lr={lr}",
            f"seed={seed}",
            *extra,
            f"hydra.run.dir={where}",
        ]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "normbench", "train", *args], capture_output=True, check=False)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
        where.mkdir(parents=True, exist_ok=True)
        (where / "cost.json").write_text(json.dumps({"cpu_s": cpu, "wall_s": time.perf_counter() - start}))
    return point(where)


def point(where: Path) -> dict:
    """One run's best val loss (inf when it diverged or failed) and its CPU seconds."""
    try:
        s = json.loads((where / "summary.json").read_text())
        loss = s.get("best_val_loss")
        loss = math.inf if loss is None or s.get("status") != "completed" else float(loss)
    except (OSError, ValueError):
        loss = math.inf
    cost = where / "cost.json"
    cpu = json.loads(cost.read_text())["cpu_s"] if cost.exists() else 0.0
    return {"loss": loss, "cpu_s": cpu}


def collect(out: Path, prior: Path | None = None) -> dict:
    """arch -> param -> width -> lr -> [losses over seeds]; the total CPU seconds of the runs here; and, with
    ``prior`` (an earlier plot's json, whose runs are gone), that json's seed-0 losses where no seed-0 run
    is here, and the difference at the points rerun (a check that seed 0 reproduces)."""
    seeds: dict = {}
    cpu = 0.0
    for done in sorted(out.glob("*/*/d*/lr*/s*/cost.json")):  # written when the run's process has ended
        where = done.parent
        arch, param, d, lr, seed = (where.parts[i] for i in (-5, -4, -3, -2, -1))
        p = point(where)
        cpu += p["cpu_s"]
        by_lr = seeds.setdefault(arch, {}).setdefault(param, {}).setdefault(int(d[1:]), {})
        by_lr.setdefault(float(lr[2:]), {})[int(seed[1:])] = p["loss"]
    reused, rerun = 0, []
    for arch, param, width, lr, losses in _points(json.loads(prior.read_text())["table"]) if prior else ():
        if param == "mup" and width == BASE_WIDTH:
            continue  # the SP runs stood in for it there (plot), and do again
        point_ = seeds.setdefault(arch, {}).setdefault(param, {}).setdefault(width, {}).setdefault(lr, {})
        if 0 in point_:
            rerun.append({"point": f"{arch}/{param}/d{width}/lr{lr:g}", "prior": losses[0], "rerun": point_[0]})
        else:
            point_[0] = losses[0]
            reused += 1
    table = {
        a: {
            p: {w: {lr: [v for _, v in sorted(by_seed.items())] for lr, by_seed in ws.items()} for w, ws in ps.items()}
            for p, ps in t.items()
        }
        for a, t in seeds.items()
    }
    return {"table": table, "cpu_s": round(cpu, 1), "prior_points": reused, "rerun": rerun}


def _points(table: dict):
    """(arch, param, width, lr, losses) of each point of a plot's json table."""
    for arch, params in table.items():
        for param, widths in params.items():
            for width, lrs in widths.items():
                for lr, losses in lrs.items():
                    yield arch, param, int(width), float(lr), losses


def best_lrs(curves: dict) -> dict:
    """width -> best lr of the seed mean, its mean loss, the seeds, and each seed's own best lr (the
    seeds each ran the whole grid of their width; a seed missing a point has no best of its own)."""
    out = {}
    for width, by_lr in curves.items():
        means = {lr: sum(v) / len(v) for lr, v in by_lr.items()}
        lr = min(means, key=means.get)
        seeds = min(len(v) for v in by_lr.values())
        per_seed = [min(by_lr, key=lambda x, i=i: by_lr[x][i]) for i in range(seeds)]
        out[width] = {"lr": lr, "loss": round(means[lr], 4), "seeds": seeds, "per_seed": per_seed}
    return out


def plot(out: Path, png: Path, json_path: Path, prior: Path | None = None) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # matplotlib.ticker.NullFormatter

    data = collect(out, prior)
    table = data["table"]
    for arch in table:  # muP at d_base is SP bit for bit (tests/test_mup.py): the SP runs stand for it
        if "mup" in table[arch] and "sp" in table[arch]:
            for width in set(table[arch]["sp"]) - set(table[arch]["mup"]):
                if width == BASE_WIDTH:
                    table[arch]["mup"][width] = table[arch]["sp"][width]
    archs = sorted(table, key=lambda a: (a != "pre_ln", a))
    panels = [(arch, param) for arch in archs for param in ("sp", "mup")]
    fig, grid = plt.subplots(len(archs), 2, figsize=(9.0, 3.4 * len(archs)), squeeze=False, sharey=True)
    axes = [[ax for row in grid for ax in row]]
    result = {"cpu_s": data["cpu_s"], "prior_points": data["prior_points"], "rerun": data["rerun"], "best": {}}
    for ax, (arch, param) in zip(axes[0], panels):
        curves = table[arch].get(param)
        if not curves:
            ax.set_visible(False)
            continue
        best = best_lrs(curves)
        result["best"][f"{arch}/{param}"] = best
        for width in sorted(curves):
            i = {64: 0, 128: 1, 256: 2}.get(width, 3)  # one colour per width in every panel
            lrs = sorted(curves[width])
            means = [min(sum(curves[width][lr]) / len(curves[width][lr]), TOP) for lr in lrs]
            lo = [min(min(curves[width][lr]), TOP) for lr in lrs]
            hi = [min(max(curves[width][lr]), TOP) for lr in lrs]
            ax.fill_between(lrs, lo, hi, color=f"C{i}", alpha=0.2, lw=0)  # the seeds' range
            ax.plot(lrs, means, "o-", color=f"C{i}", label=f"d {width} (best lr {best[width]['lr']:.3g})", ms=4)
            ax.plot([best[width]["lr"]], [best[width]["loss"]], "*", color=f"C{i}", ms=12)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        all_lrs = [lr for c in curves.values() for lr in c]
        ticks = [t for t in (3e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2) if min(all_lrs) <= t <= max(all_lrs)]
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.set_title(f"{arch}, {'muP (d_base 64)' if param == 'mup' else 'SP'}", fontsize=10)
        ax.set_xlabel("AdamW lr")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    low = min(b["loss"] for bests in result["best"].values() for b in bests.values())
    grid[0][0].set_ylim(low - 0.03, TOP + 0.02)  # shared by every panel
    for row in grid:
        row[0].set_ylabel(f"best val loss (>{TOP}: at {TOP})")
    seeds = "-".join(map(str, sorted({b["seeds"] for bests in result["best"].values() for b in bests.values()})))
    fig.suptitle(
        "LR transfer: LayerNorm, 4 blocks, d_head 16, 200 steps x 16 x 64 tokens at every width; "
        f"mean of {seeds} seed(s), band: their range (star: best)",
        fontsize=9,
    )
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    result["table"] = {
        a: {p: {str(w): {f"{lr:g}": v for lr, v in c.items()} for w, c in ps.items()} for p, ps in t.items()}
        for a, t in table.items()
    }
    json_path.write_text(json.dumps(result, indent=1))
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["run", "plot"])
    ap.add_argument("--out", type=Path, default=Path("outputs/lrsweep"))
    ap.add_argument("--arch", default="pre_ln")
    ap.add_argument("--param", default="sp")
    ap.add_argument("--widths", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--lrs", type=float, nargs="+", default=[])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--png", type=Path, default=Path("docs/img/mup_lr_transfer.png"))
    ap.add_argument("--json", type=Path, default=Path("docs/img/mup_lr_transfer.json"))
    ap.add_argument("--prior", type=Path, default=None, help="plot: an earlier json whose seed-0 runs are gone")
    ap.add_argument("extra", nargs="*", help="further overrides for every run")
    a = ap.parse_intermixed_args()  # overrides may follow the options
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if a.mode == "plot":
        result = plot(a.out, a.png, a.json, a.prior)
        print(json.dumps({k: result[k] for k in ("best", "prior_points", "rerun", "cpu_s")}, indent=1))
        return
    for seed in a.seeds:
        for width in a.widths:
            for lr in a.lrs:
                p = run_point(a.out, a.arch, a.param, width, lr, seed, a.extra)
                print(
                    f"{a.arch} {a.param} d{width} lr {lr:.3g} seed {seed}: {p['loss']:.4f} ({p['cpu_s']:.0f} s)",
                    flush=True,
                )


if __name__ == "__main__":
    main()
