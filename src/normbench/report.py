"""Tables and plots for one run or a whole sweep: ``python -m normbench report DIR``.

The contract is docs/contract.md §3-5 (what a run directory holds) and §7 (what the
report shows). :func:`make_report` finds every run below DIR, groups runs by the Hydra
overrides that differ between them (seeds are averaged over) and writes
``report.md``, ``report.html`` (the same content with the plots embedded, one file
to send) and PNG plots. Diverged, failed and still-running runs are always shown,
never dropped. :func:`read_metrics` is the tolerant ``metrics.jsonl`` reader that
other modules import.
"""

from __future__ import annotations

import argparse
import base64
import html
import json
import math
import os
import re
import socket
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from normbench.errors import ConfigError
from normbench.metrics import read_jsonl
from normbench.rundir import BOOKKEEPING_KEYS

# A fixed colour per architecture, so every plot (and every report) agrees.
ARCH_COLORS = {
    "pre_ln": "tab:blue",
    "post_ln": "tab:orange",
    "peri_ln": "tab:green",
    "mix_ln": "tab:red",
    "hybridnorm": "tab:purple",
    "hybridnorm_star": "tab:brown",
    "deepnorm": "tab:pink",
    "ngpt": "tab:olive",
}
OTHER_COLORS = ("tab:cyan", "tab:gray", "black", "gold", "navy", "teal")
NORM_STYLES = {"layernorm": "-", "rmsnorm": "--", "dyt": ":", "derf": "-.", "none": (0, (5, 1, 1, 1))}
MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*")
STATUS_ORDER = ("completed", "diverged", "failed", "interrupted", "running")
DASH = "—"
# (file, metric, title, default steps: "fml" = first/middle/last diag step, "fl" = first/last)
DEPTH_PLOTS = (
    ("var_resid_depth.png", "var_resid", "residual-stream variance vs depth", "fml"),
    ("grad_norm_layer_depth.png", "grad_norm_layer", "gradient norm per block", "fl"),
    ("maxabs_resid_depth.png", "maxabs_resid", "max |activation| vs depth", "fml"),
)


def read_metrics(path: str | Path) -> list[dict]:
    """Records of a ``metrics.jsonl`` in file order; ``[]`` if the file is missing.

    A run that is still writing, or was killed mid-write, can leave a truncated last
    line: :func:`normbench.metrics.read_jsonl` skips it, and records without an
    integer ``step`` are left out here.
    """
    try:
        records = read_jsonl(Path(path))
    except OSError:
        return []
    return [r for r in records if type(r.get("step")) is int]


def _finite(x) -> bool:
    """A real number; metrics.jsonl stores +-inf as +-1e308 (JSON has no inf), so those are not."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and abs(x) < 1e308


def _series(records: list[dict], key: str) -> list[tuple[int, object]]:
    """(step, value) for records that have ``key``, sorted by step; a later record wins
    (a resumed run logs again the steps after its last checkpoint)."""
    by_step = {r["step"]: r[key] for r in records if r.get(key) is not None}
    return sorted(by_step.items())


@dataclass
class Run:
    path: Path
    config: dict
    overrides: list[str]
    summary: dict | None
    records: list[dict]
    live: bool = False  # a live process holds the run's .lock

    @property
    def status(self) -> str:
        status = str((self.summary or {}).get("status") or "")
        if status and status != "running":
            return status
        if self.live:
            return "running"
        # no process trains it and it never finished: killed (or died at start)
        return "failed"

    @property
    def reason(self) -> str:
        if self.summary and self.summary.get("status") != "running":
            return str(self.summary.get("reason") or "")
        step = max((r["step"] for r in self.records), default=(self.summary or {}).get("step"))
        if self.live:
            where = _remote_holder(self.path)
            return (f"no summary yet, at step {step}" if step is not None else "starting") + where
        if self.records or self.summary:
            return f"stopped at step {step} without finishing (killed?)"
        return "no data"


def _lock_owner(lock: Path) -> tuple[str, str]:
    """(host, pid) from a run's ``.lock`` (``host:pid``); ("", "") when there is none."""
    try:
        host, _, pid = lock.read_text(errors="replace").strip().partition(":")
    except OSError:
        return "", ""
    return host, pid


def _remote_holder(run_dir: Path) -> str:
    """For a run held from another host (liveness unknown here): which host, and how long ago
    the run last wrote, so a job killed on a cluster node is recognisable."""
    host, _ = _lock_owner(run_dir / ".lock")
    if not host or host == socket.gethostname():
        return ""
    mtimes = [p.stat().st_mtime for p in (run_dir / "metrics.jsonl", run_dir / "summary.json") if p.exists()]
    if not mtimes:
        return f" (on {host})"
    minutes = max(0.0, time.time() - max(mtimes)) / 60
    return f" (on {host}, last write {minutes:.0f} min ago)"


def _alive(lock: Path) -> bool:
    """Whether the process named in a run's ``.lock`` (``host:pid``, written by the trainer,
    removed when it ends) still lives. Read-only: the report never takes the lock. A lock
    from another host counts as alive (a job on a cluster node)."""
    host, pid = _lock_owner(lock)
    if not host:
        return False
    if host != socket.gethostname():
        return True
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def _load_yaml(path: Path):
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None


def load_run(path: Path) -> Run:
    cfg = _load_yaml(path / ".hydra" / "config.yaml")
    ovr = _load_yaml(path / ".hydra" / "overrides.yaml")
    try:
        summary = json.loads((path / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        summary = None
    return Run(
        path=path,
        config=cfg if isinstance(cfg, dict) else {},
        overrides=[str(o) for o in ovr] if isinstance(ovr, list) else [],
        summary=summary if isinstance(summary, dict) else None,
        records=read_metrics(path / "metrics.jsonl"),
        live=_alive(path / ".lock"),
    )


def find_runs(root: Path) -> list[Run]:
    """Every run at or below ``root``: a directory with summary.json, metrics.jsonl or
    .hydra/config.yaml (so running and crashed jobs are found too)."""
    dirs = {p.parent for name in ("summary.json", "metrics.jsonl") for p in root.rglob(name)}
    dirs |= {p.parent.parent for p in root.rglob("config.yaml") if p.parent.name == ".hydra"}
    # natural order, so Hydra's job dirs 0, 1, ..., 10 keep the sweep's order
    natural = lambda p: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(p))]
    return [load_run(d) for d in sorted(dirs, key=natural)]


def _norm_value(value: str) -> str:
    """``1e-3`` and ``0.001`` (or ``12`` and ``12.0``) must group together."""
    try:
        f = float(value)
    except ValueError:
        return value
    if not math.isfinite(f):
        return value
    return str(int(f)) if f.is_integer() and abs(f) < 1e15 else repr(f)


def _setting(run: Run, key: str) -> str | None:
    """A run's value for an override key: its override, else its config, else its summary.

    arch/norm/optim/seed come from the summary first: the run itself wrote them (a resume
    refused for a changed arch leaves no trace there)."""
    if key in ("arch", "norm", "optim", "seed") and (run.summary or {}).get(key) is not None:
        return _norm_value(str(run.summary[key]))
    for o in run.overrides:
        k, sep, v = o.partition("=")
        if sep and k.lstrip("+~") == key:
            return _norm_value(v)
    node = run.config
    for part in key.replace("/", ".").split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict):  # a config group: arch -> arch.name
        node = node.get("name")
    if node is None and key in ("arch", "norm", "optim", "seed"):
        node = (run.summary or {}).get(key)
    if isinstance(node, bool):
        return str(node).lower()
    return None if node is None else _norm_value(str(node))


def _is_lr_key(key: str) -> bool:
    return key == "lr" or key.endswith(".lr")


@dataclass
class Group:
    label: str
    series: str  # the label without the learning rate: one line in the lr sweep
    arch: str
    norm: str
    runs: list[Run] = field(default_factory=list)


def group_runs(runs: list[Run]) -> list[Group]:
    """Group by the overrides whose values differ between runs, except ``seed``."""
    keys = {}  # ordered set, in the order Hydra wrote the overrides
    for run in runs:
        for o in run.overrides:
            k, sep, _ = o.partition("=")
            k = k.lstrip("+~")
            if sep and k != "seed" and not k.startswith("hydra") and k not in BOOKKEEPING_KEYS:
                keys[k] = None
    varying = [k for k in keys if len({_setting(r, k) for r in runs}) > 1]
    groups: dict[str, Group] = {}
    for run in runs:
        arch, norm = _setting(run, "arch") or "?", _setting(run, "norm") or "?"
        default = f"arch={arch} norm={norm}"
        label = " ".join(f"{k}={_setting(run, k)}" for k in varying) or default
        series = " ".join(f"{k}={_setting(run, k)}" for k in varying if not _is_lr_key(k)) or default
        groups.setdefault(label, Group(label, series, arch, norm)).runs.append(run)
    return list(groups.values())


def _lr(run: Run) -> float | None:
    value = _setting(run, "optim.lr")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _val_losses(run: Run) -> tuple[float | None, float | None]:
    """(final, best) val loss: from summary.json, else from the metrics logged so far."""
    s = run.summary or {}
    vals = [v for _, v in _series(run.records, "val_loss") if _finite(v)]
    final = s.get("final_val_loss") if _finite(s.get("final_val_loss")) else (vals[-1] if vals else None)
    best = s.get("best_val_loss") if _finite(s.get("best_val_loss")) else (min(vals) if vals else None)
    return final, best


def _loss_pool(group: Group) -> tuple[list[Run], bool]:
    """Runs whose losses are averaged: completed ones; if none yet, running/interrupted
    ones (marked partial). Diverged losses are meaningless and never averaged."""
    done = [r for r in group.runs if r.status == "completed"]
    return done or [r for r in group.runs if r.status in ("running", "interrupted")], not done


def _mean_std(xs: list[float], suffix: str = "") -> str:
    if not xs:
        return DASH
    m = statistics.fmean(xs)
    return (f"{m:.4f}" if len(xs) == 1 else f"{m:.4f} ± {statistics.stdev(xs):.4f}") + suffix


def _steps_to(run: Run, target: float) -> int | None:
    pts = _series(run.records, "val_loss") or _series(run.records, "loss")
    return next((s for s, v in pts if _finite(v) and v <= target), None)


def _best_loss(group: Group) -> float | None:
    pool, _ = _loss_pool(group)
    bests = [b for r in pool if (b := _val_losses(r)[1]) is not None]
    return statistics.fmean(bests) if bests else None


def default_target(groups: list[Group]) -> float | None:
    """Median over groups of the mean best val loss, rounded up to 2 decimals: about half
    of the groups reach it. Without any eval, the same on the lowest train loss."""
    bests = [b for g in groups if (b := _best_loss(g)) is not None]
    if not bests:
        for g in groups:
            mins = [min(v for _, v in pts) for r in _loss_pool(g)[0] if (pts := _finite_series(r, "loss"))]
            bests += [statistics.fmean(mins)] if mins else []
    return math.ceil(round(statistics.median(bests) * 100, 6)) / 100 if bests else None


def _finite_series(run: Run, key: str) -> list[tuple[int, float]]:
    return [(s, v) for s, v in _series(run.records, key) if _finite(v)]


def _count(value) -> int | None:
    if isinstance(value, list):
        return len(value)
    return int(value) if _finite(value) else None


def main_table(groups: list[Group], target: float | None) -> tuple[list[str], list[list[str]]]:
    header = ["group", "runs", "status", "final val loss", "best val loss",
              f"steps to loss ≤ {target:g}" if target is not None else "steps to target",
              "tokens/s", "spikes", "diverged", "notes"]  # fmt: skip
    rows = []
    for g in sorted(groups, key=lambda g: (_best_loss(g) is None, _best_loss(g) or 0.0, g.label)):
        n = len(g.runs)
        counts = Counter(r.status for r in g.runs)
        order = [s for s in STATUS_ORDER if s in counts] + sorted(set(counts) - set(STATUS_ORDER))
        pool, partial = _loss_pool(g)
        finals = [f for r in pool if (f := _val_losses(r)[0]) is not None]
        bests = [b for r in pool if (b := _val_losses(r)[1]) is not None]
        mark = " (partial)" if partial else ""
        reached = [s for r in g.runs if target is not None and (s := _steps_to(r, target)) is not None]
        steps = DASH if not reached else f"{statistics.fmean(reached):.0f}"
        if reached and len(reached) < n:
            steps += f" ({len(reached)}/{n})"
        # steady-state tokens/s of the runs whose losses are averaged (summary.json, docs/contract.md §5)
        tps = [t for r in pool if _finite(t := (r.summary or {}).get("tokens_per_s"))]
        spikes = [c for r in g.runs if (c := _count((r.summary or {}).get("spikes"))) is not None]
        notes = dict.fromkeys(f"{r.status}: {r.reason}" for r in g.runs if r.status != "completed")
        rows.append([
            g.label, str(n), ", ".join(f"{counts[s]} {s}" for s in order),
            _mean_std(finals, mark), _mean_std(bests, mark), steps,
            f"{statistics.fmean(tps):,.0f}" if tps else DASH,
            str(sum(spikes)) if spikes else DASH, str(counts["diverged"]), "; ".join(notes),
        ])  # fmt: skip
    return header, rows


def lr_sweep(groups: list[Group]) -> dict[str, dict[float, list[Run]]] | None:
    """series -> lr -> runs, or None when no series tries two learning rates (an optimizer
    sweep has one default lr per optimizer: that is not an lr sweep)."""
    sweep: dict[str, dict[float, list[Run]]] = {}
    for g in groups:
        for r in g.runs:
            if (lr := _lr(r)) is not None:
                sweep.setdefault(g.series, {}).setdefault(lr, []).append(r)
    return sweep if any(len(by_lr) > 1 for by_lr in sweep.values()) else None


def lr_table(sweep: dict[str, dict[float, list[Run]]]) -> tuple[list[str], list[list[str]]]:
    """Largest stable lr: the largest lr at which no run diverged and at least one completed.
    An lr with runs not (yet) completed is marked: "0.001 (1 running)"; failed runs (crashes)
    say nothing about stability, so they are marked, not counted as divergence."""
    header = ["group", "learning rates tried", "diverged at", "largest stable lr", "best val loss there"]
    rows = []
    for series, by_lr in sweep.items():
        stable = [
            lr
            for lr, runs in by_lr.items()
            if not any(r.status == "diverged" for r in runs) and any(r.status == "completed" for r in runs)
        ]
        bad = [lr for lr, runs in by_lr.items() if any(r.status == "diverged" for r in runs)]

        def tried(lr: float, by_lr=by_lr) -> str:
            other = Counter(r.status for r in by_lr[lr] if r.status not in ("completed", "diverged"))
            return f"{lr:g}" + (f" ({', '.join(f'{n} {s}' for s, n in sorted(other.items()))})" if other else "")

        best = DASH
        if stable:
            done = [r for r in by_lr[max(stable)] if r.status == "completed"]
            best = _mean_std([b for r in done if (b := _val_losses(r)[1]) is not None])
        rows.append([series, ", ".join(tried(lr) for lr in sorted(by_lr)),
                     ", ".join(f"{lr:g}" for lr in sorted(bad)) or DASH,
                     tried(max(stable)) if stable else DASH, best])  # fmt: skip
    return header, rows


# ---------------------------------------------------------------- plots


def _styles(groups: list[Group]) -> dict[str, dict]:
    unknown = sorted({g.arch for g in groups} - set(ARCH_COLORS))
    used: Counter = Counter()
    styles = {}
    for g in groups:
        color = ARCH_COLORS.get(g.arch) or OTHER_COLORS[unknown.index(g.arch) % len(OTHER_COLORS)]
        ls = NORM_STYLES.get(g.norm, "-")
        k = used[(color, str(ls))]  # same arch and norm (e.g. an lr sweep): tell apart by marker
        used[(color, str(ls))] += 1
        styles[g.label] = {
            "color": color,
            "linestyle": ls,
            "marker": MARKERS[k % len(MARKERS)] if k else None,
        }
    return styles


def _mean_curve(runs: list[Run], key: str) -> tuple[list[int], list[float]]:
    by_step: dict[int, list[float]] = {}
    for r in runs:
        for s, v in _finite_series(r, key):
            by_step.setdefault(s, []).append(v)
    steps = sorted(by_step)
    return steps, [statistics.fmean(by_step[s]) for s in steps]


def _depth_profile(runs: list[Run], key: str, step: int, reached: bool = True) -> list[float] | None:
    """Mean over seeds of a per-layer list at ``step`` (the run's last diag step at or
    before it; with ``reached``, runs that stopped before ``step`` are left out)."""
    lists = []
    for r in runs:
        pts = [(s, v) for s, v in _series(r.records, key) if isinstance(v, list)]
        if pts and (pts[-1][0] >= step or not reached) and (before := [v for s, v in pts if s <= step]):
            lists.append(before[-1])
    if not lists:
        return None
    n = Counter(len(v) for v in lists).most_common(1)[0][0]  # same depth within a group
    cols = [[v[i] for v in lists if len(v) == n and _finite(v[i]) and v[i] > 0] for i in range(n)]
    return [statistics.fmean(c) if c else math.nan for c in cols]


def _steps_for(groups: list[Group], key: str, kind: str, steps: list[int] | None) -> list[int]:
    if steps:
        return steps
    have = sorted({s for g in groups for r in g.runs for s, v in _series(r.records, key) if isinstance(v, list)})
    if not have:
        return []
    picks = [have[0], have[len(have) // 2], have[-1]] if kind == "fml" else [have[0], have[-1]]
    return list(dict.fromkeys(picks))


def _figure(ncols: int):
    from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend (Agg)

    fig = Figure(figsize=(4.8 * ncols, 3.8), layout="constrained")
    return fig, fig.subplots(1, ncols, squeeze=False)[0]


def plot_losses(groups, styles, path: Path) -> bool:
    has_val = any(_finite_series(r, "val_loss") for g in groups for r in g.runs)
    if not any(_finite_series(r, "loss") for g in groups for r in g.runs):
        return False
    fig, axes = _figure(2 if has_val else 1)
    for ax, key, title in zip(axes, ("loss", "val_loss"), ("train loss", "val loss")):
        for g in groups:
            pool, _ = _loss_pool(g)  # the runs the table averages: diverged/failed ones are not
            steps, ys = _mean_curve(pool, key)
            if steps:
                lone = {"marker": "o"} if len(steps) == 1 else {}  # a single point is invisible otherwise
                ax.plot(steps, ys, label=g.label, markevery=0.1, **{**styles[g.label], **lone})
            label = None if steps else f"{g.label} (diverged)"  # a group with no mean curve: named once
            for r in g.runs:  # diverged runs: faint, each on its own, ending in an x
                pts = [(st, v) for st, v in _series(r.records, key) if _finite(v)] if r.status == "diverged" else []
                if pts:
                    xs, vs = zip(*pts)
                    color = styles[g.label].get("color")
                    ax.plot(xs, vs, color=color, alpha=0.35, linewidth=0.8, label=label)
                    ax.plot(xs[-1:], vs[-1:], "x", color=color, alpha=0.6)
                    label = None
        ax.set(title=f"{title} (mean over seeds; x: diverged)", xlabel="step", ylabel="loss")
    axes[0].legend(fontsize="x-small")
    fig.savefig(path, dpi=100)
    return True


def plot_depth(groups, styles, key: str, steps: list[int], title: str, path: Path) -> bool:
    fig, axes = _figure(len(steps))
    drawn = False
    for ax, step in zip(axes, steps):
        for g in groups:
            st = styles[g.label]
            if (ys := _depth_profile(_loss_pool(g)[0], key, step)) is not None:
                ax.plot(range(len(ys)), ys, label=g.label, **{**st, "marker": st["marker"] or "o"})
                drawn = True
            elif (ys := _depth_profile([r for r in g.runs if r.status == "diverged"], key, step, False)) is not None:
                # a group whose runs all diverged: faint, with x, at its last diag step <= step
                label = f"{g.label} (diverged; last diag step <= {step})"
                ax.plot(range(len(ys)), ys, label=label, **{**st, "marker": "x", "alpha": 0.4})
                drawn = True
        xlabel = "block" if key == "grad_norm_layer" else "depth (0 = embedding, l = after block l)"
        ax.set(title=f"step {step}", xlabel=xlabel, ylabel=key, yscale="log")
        ax.xaxis.get_major_locator().set_params(integer=True)
    if not drawn:
        return False
    fig.suptitle(f"{title} (mean over seeds)")
    axes[0].legend(fontsize="x-small")
    fig.savefig(path, dpi=100)
    return True


def plot_lr(sweep, groups, styles, path: Path) -> None:
    fig, axes = _figure(1)
    ax = axes[0]
    series_style = {g.series: styles[g.label] for g in groups}
    for series, by_lr in sweep.items():
        st = {**series_style[series], "marker": "o"}
        points = [(lr, _lr_point(by_lr[lr])) for lr in sorted(by_lr) if _lr_point(by_lr[lr])]
        ax.plot([p[0] for p in points], [p[1][1] for p in points], label=f"{series}: best", **st)
        ax.plot([p[0] for p in points], [p[1][0] for p in points], label=f"{series}: final", alpha=0.35, **st)
        # unstable lrs (some run not completed): an x at the top of the axes
        bad = [lr for lr, runs in by_lr.items() if any(r.status == "diverged" for r in runs)]
        ax.plot(bad, [0.97] * len(bad), "x", ms=9, color=st["color"], transform=ax.get_xaxis_transform())
    ax.set(xscale="log", xlabel="learning rate", ylabel="val loss (completed runs)")
    ax.set_title("val loss vs learning rate (x: a run diverged)", fontsize="small")
    ax.legend(fontsize="x-small")
    fig.savefig(path, dpi=100)


def _lr_point(runs: list[Run]) -> tuple[float, float] | None:
    """(mean final, mean best) val loss over the completed runs, or None."""
    vals = [_val_losses(r) for r in runs if r.status == "completed"]
    vals = [(f, b) for f, b in vals if f is not None and b is not None]
    return (statistics.fmean(v[0] for v in vals), statistics.fmean(v[1] for v in vals)) if vals else None


# ---------------------------------------------------------------- output


def _md(blocks: list[tuple]) -> str:
    out = []
    for kind, *rest in blocks:
        if kind == "h":
            out.append(f"{'#' * rest[0]} {rest[1]}")
        elif kind == "p":
            out.append(rest[0])
        elif kind == "table":
            header, rows = rest
            cell = lambda c: str(c).replace("|", "\\|")
            out += ["| " + " | ".join(map(cell, header)) + " |", "|" + "---|" * len(header)]
            out += ["| " + " | ".join(map(cell, row)) + " |" for row in rows]
        elif kind == "img":
            out.append(f"![{rest[1]}]({rest[0]})")
        out.append("")
    return "\n".join(out)


def _html(blocks: list[tuple], out_dir: Path) -> str:
    code = lambda t: re.sub(r"`([^`]*)`", r"<code>\1</code>", html.escape(str(t)))
    body = []
    for kind, *rest in blocks:
        if kind == "h":
            body.append(f"<h{rest[0]}>{code(rest[1])}</h{rest[0]}>")
        elif kind == "p":
            body.append(f"<p>{code(rest[0])}</p>")
        elif kind == "table":
            header, rows = rest
            body.append("<table>\n<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>")
            body += ["<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows]
            body.append("</table>")
        elif kind == "img":
            data = base64.b64encode((out_dir / rest[0]).read_bytes()).decode("ascii")
            body.append(f'<p><img alt="{html.escape(rest[1])}" src="data:image/png;base64,{data}"></p>')
    style = ("body{font-family:sans-serif;max-width:80em;margin:auto}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:2px 6px}img{max-width:100%}")  # fmt: skip
    return (f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>normbench report</title>'
            f"<style>{style}</style></head>\n<body>\n" + "\n".join(body) + "\n</body></html>\n")  # fmt: skip


def build_report(root: Path, target_loss=None, steps=None, out=None) -> tuple[Path, Path, list[Path], int]:
    """Write the report; return (report.md, report.html, plot paths, number of runs)."""
    root = Path(root)
    if not root.is_dir():
        raise ConfigError(f"no such directory: {root}")
    runs = find_runs(root)
    if not runs:
        raise ConfigError(f"no runs below {root} (looked for summary.json, metrics.jsonl, .hydra/)")
    out_dir = Path(out) if out is not None else root
    out_dir.mkdir(parents=True, exist_ok=True)
    groups = group_runs(runs)
    target = target_loss if target_loss is not None else default_target(groups)
    how = "given" if target_loss is not None else "median over groups of the best val loss, rounded up"
    blocks: list[tuple] = [
        ("h", 1, "normbench report"),
        ("p", (f"{len(runs)} runs in {len(groups)} groups below `{root}`. Losses: mean ± sample std over "
              f"seeds of the completed runs ('partial': none completed yet, so the runs so far). "
              f"Target loss: {f'{target:g}' if target is not None else DASH} ({how}); steps to it "
              f"on val loss (train loss for runs without eval), (k/n) when only k of n runs reached it.")),
        ("table", *main_table(groups, target)),
    ]  # fmt: skip
    sweep = lr_sweep(groups)
    if sweep:
        blocks += [("h", 2, "Largest stable learning rate"),
                   ("p", "Largest lr at which no run diverged and at least one completed; "
                         "runs not completed (running, failed) are counted in brackets."),
                   ("table", *lr_table(sweep))]  # fmt: skip
    # hydra/sweeper=optuna writes optimization_results.yaml into its sweep dir at the end (DIR may be a parent)
    for found in sorted(root.rglob("optimization_results.yaml")):
        optuna = _load_yaml(found)
        if not (isinstance(optuna, dict) and "best_params" in optuna):
            continue
        best = ", ".join(f"`{k}={v}`" for k, v in (optuna.get("best_params") or {}).items())
        where = "" if found.parent == root else f" ({found.parent.relative_to(root)})"
        blocks += [("h", 2, f"Optuna search{where}"),
                   ("p", f"Best parameters: {best or DASH}; best value (best val loss): {optuna.get('best_value')}. "
                         "Diverged trials count as 1e6, failed ones as inf.")]  # fmt: skip
    rows = [[str(r.path.relative_to(root)), g.label, _setting(r, "seed") or DASH, r.status,
             str(max((x["step"] for x in r.records), default=(r.summary or {}).get("step", DASH))),
             _mean_std([b] if (b := _val_losses(r)[1]) is not None else []), r.reason]
            for g in groups for r in g.runs]  # fmt: skip
    blocks += [("h", 2, "All runs"), ("table", ["run", "group", "seed", "status", "step", "best val loss",
                                                "reason"], rows)]  # fmt: skip

    styles = _styles(groups)
    plots: list[Path] = []
    blocks.append(("h", 2, "Plots"))

    def add(name: str, made: bool, what: str, key: str) -> None:
        if made:
            plots.append(out_dir / name)
            blocks.extend([("h", 3, what), ("img", name, what)])
        else:  # say why instead of leaving a hole
            at = " at the chosen steps" if steps and key != "loss" else ""
            blocks.append(("p", f"`{name}` skipped: no run logged `{key}`{at}."))

    add("loss_curves.png", plot_losses(groups, styles, out_dir / "loss_curves.png"), "loss curves", "loss")
    for name, key, title, kind in DEPTH_PLOTS:
        chosen = _steps_for(groups, key, kind, steps)
        made = bool(chosen) and plot_depth(groups, styles, key, chosen, title, out_dir / name)
        add(name, made, title, key)
    if sweep:
        plot_lr(sweep, groups, styles, out_dir / "lr_sweep.png")
        add("lr_sweep.png", True, "val loss vs learning rate", "val_loss")

    md_path, html_path = out_dir / "report.md", out_dir / "report.html"
    md_path.write_text(_md(blocks), encoding="utf-8")
    html_path.write_text(_html(blocks, out_dir), encoding="utf-8")
    return md_path, html_path, plots, len(runs)


def make_report(root: Path, target_loss: float | None = None, steps: list[int] | None = None,
                out: Path | None = None) -> Path:  # fmt: skip
    """Write report.md, report.html and the plots into ``out`` (default ``root``);
    return the path of report.md. Raises ConfigError when ``root`` holds no runs."""
    return build_report(root, target_loss, steps, out)[0]


def _step_list(text: str) -> list[int]:
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected steps like 0,100,500, got {text!r}") from None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="normbench report", description="Tables and plots for a run or a sweep.")
    parser.add_argument("dir", type=Path, help="a run directory or a sweep directory above runs")
    parser.add_argument("--target-loss", type=float, help="loss for the 'steps to target' column")
    parser.add_argument("--steps", type=_step_list, help="steps for the depth plots, e.g. 0,100,500")
    parser.add_argument("--out", type=Path, help="where to write (default: DIR)")
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help or a usage error: argparse has printed it
        return int(e.code or 0)
    try:
        md, page, plots, n = build_report(args.dir, args.target_loss, args.steps, args.out)
    except ConfigError as e:
        print(f"normbench: error: {e}", file=sys.stderr)
        return 2
    print(f"normbench: report on {n} runs: {md}")
    print(f"normbench: html (plots embedded): {page}")
    for p in plots:
        print(f"normbench: plot: {p}")
    return 0
