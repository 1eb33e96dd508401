"""One figure per claim: each test's per-seed values by group, the mean and the verdict."""

from __future__ import annotations

from pathlib import Path


def plot_claim(result: dict, runs, claim, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tests = result["tests"]
    fig, axes = plt.subplots(1, len(tests), figsize=(4.2 * len(tests), 3.4), squeeze=False)
    for ax, t in zip(axes[0], tests):
        for i, g in enumerate(t["groups"].values()):
            vals = [v for v in g["values"] if v is not None]
            ax.scatter([i] * len(vals), vals, s=18, alpha=0.7)
            if g["mean"] is not None:
                ax.hlines(g["mean"], i - 0.25, i + 0.25, color="k")
            bad = {k: n for k, n in g["outcomes"].items() if k not in ("learned", "unstable")}
            if bad:
                ax.annotate(", ".join(f"{n} {k}" for k, n in bad.items()), (i, 0), xycoords=("data", "axes fraction"),
                            ha="center", va="bottom", fontsize=7, color="crimson")  # fmt: skip
        ax.set_xticks(range(len(t["groups"])), [g.replace(" ", "\n") for g in t["groups"]], fontsize=7)
        ax.set_xlim(-0.6, len(t["groups"]) - 0.4)
        ax.set_title(f"{t['name']}\n{t['verdict']}", fontsize=9)
        ax.set_ylabel(t["metric"].split(" (")[0], fontsize=8)
        if t["metric"].startswith(("var_growth", "grad_spread", "massive")) and all(
            v > 0 for g in t["groups"].values() for v in g["values"]
        ):
            ax.set_yscale("log")
    fig.suptitle(f"{result['claim']} ({result['scale']}): {result['verdict']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
