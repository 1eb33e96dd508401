"""One figure per claim: each test's per-seed values by group, the mean and the verdict; for a
largest-LR test, the share of seeds that learned at each LR of the grid, per group."""

from __future__ import annotations

from pathlib import Path


def plot_claim(result: dict, runs, claim, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tests = result["tests"]
    fig, axes = plt.subplots(1, len(tests), figsize=(4.2 * len(tests), 3.4), squeeze=False)
    for ax, t in zip(axes[0], tests):
        if t["kind"] == "largest_lr" and t.get("learned_share"):
            _plot_lr_grid(ax, t)
            continue
        for i, g in enumerate(t["groups"].values()):
            vals = [v for v in g["values"] if v is not None]
            ax.scatter([i] * len(vals), vals, s=18, alpha=0.7)
            if g["mean"] is not None:
                ax.hlines(g["mean"], i - 0.25, i + 0.25, color="k")
            bad = {k: n for k, n in g["outcomes"].items() if k not in ("learned", "unstable")}
            if bad:
                ax.annotate(", ".join(f"{n} {k}" for k, n in bad.items()), (i, 0), xycoords=("data", "axes fraction"),
                            ha="center", va="bottom", fontsize=7, color="crimson")  # fmt: skip
        tuned = t.get("tuned") or {}  # each side at its own best value: name it under the group
        labels = [g + (f" ({tuned['key']}={tuned['chosen'][g]})" if g in tuned.get("chosen", {}) else "")
                  for g in t["groups"]]  # fmt: skip
        ax.set_xticks(range(len(labels)), [g.replace(" ", "\n") for g in labels], fontsize=7)
        ax.set_xlim(-0.6, len(t["groups"]) - 0.4)
        ax.set_title(f"{t['name']}\n{t['verdict']}", fontsize=9)
        ax.set_ylabel(t["metric"].split(" (")[0], fontsize=8)
        if t["metric"].startswith(("var_growth", "grad_spread", "massive")) and all(
            v > 0 for g in t["groups"].values() for v in g["values"]
        ):
            ax.set_yscale("log")
    return save_figure(fig, path, f"{result['claim']} ({result['scale']}): {result['verdict']}")


def save_figure(fig, path: Path, title: str) -> Path:
    """Title, tight layout, PNG at the claims' resolution; the figure is closed."""
    import textwrap

    import matplotlib.pyplot as plt

    fig.suptitle(textwrap.fill(title, width=max(40, int(fig.get_figwidth() * 12))), fontsize=10)  # fits the width
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plot_lr_grid(ax, t: dict) -> None:
    """Share of each group's seeds with outcome ``learned`` per LR (the largest-LR rule, as
    :func:`.measure.judge_test` counted it), log x; the dashed line marks the group's largest LR at
    which every seed learned."""
    for label, share in t["learned_share"].items():
        grid = sorted(share)
        line = ax.plot(grid, [share[lr] for lr in grid], marker="o", label=label)[0]
        if (best := t["largest_lr"].get(label)) is not None:
            ax.axvline(best, ls="--", color=line.get_color(), alpha=0.6)
    ax.set_xscale("log")
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("learning rate", fontsize=8)
    ax.set_ylabel("share of seeds learned", fontsize=8)
    ax.legend(fontsize=7)
    ax.set_title(f"{t['name']}\n{t['verdict']}", fontsize=9)
