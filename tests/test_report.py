"""Tests for ``normbench report`` (docs/contract.md §3-5, §7) on fake run directories with real files."""

from __future__ import annotations

import base64
import json
import math
import os
import re
import socket
import statistics
import subprocess
import sys
import time

import pytest
import yaml

from normbench import report

from conftest import OFFLINE_ENV, run_cli

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
N_LAYER = 3


def fake_records(base: float, n_layer: int = N_LAYER, steps: int = 100, diag_every: int = 50):
    """Train records every 10 steps; a separate eval+diag record every ``diag_every`` steps."""
    records = []
    for step in range(0, steps + 1, 10):
        loss = base + 3.0 / (1 + step / 20)
        records.append(
            {
                "step": step,
                "tokens": step * 512,
                "loss": loss,
                "lr": 1e-3,
                "grad_norm": 1.0 / (1 + step),
                "tokens_per_s": 1000.0 + step,
                "time_s": step * 0.1,
            }
        )
        if step % diag_every == 0:
            records.append(
                {
                    "step": step,
                    "tokens": step * 512,
                    "loss": loss,
                    "lr": 1e-3,
                    "grad_norm": 0.5,
                    "tokens_per_s": 1000.0 + step,
                    "time_s": step * 0.1,
                    "val_loss": loss + 0.1,
                    "grad_norm_layer": [0.1 * (i + 1) for i in range(n_layer)],
                    "grad_norm_attn": [0.05 * (i + 1) for i in range(n_layer)],
                    "grad_norm_mlp": [0.07 * (i + 1) for i in range(n_layer)],
                    "var_resid": [1.0 + i + step / 100 for i in range(n_layer + 1)],
                    "rms_resid": [1.0 + i for i in range(n_layer + 1)],
                    "maxabs_resid": [5.0 * (i + 1) for i in range(n_layer + 1)],
                    "massive_ratio_resid": [3.0 + i for i in range(n_layer + 1)],
                }
            )
    return records


def make_run(path, overrides, config, records=None, summary=None, truncate=False):
    (path / ".hydra").mkdir(parents=True)
    (path / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    (path / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    if records is not None:
        lines = [json.dumps(r) for r in records]
        if truncate:  # a job killed mid-write
            lines.append(json.dumps(records[-1])[:25])
        (path / "metrics.jsonl").write_text("\n".join(lines) + ("" if truncate else "\n"))
    if summary is not None:
        (path / "summary.json").write_text(json.dumps(summary))
    return path


def config(arch="pre_ln", seed=0, lr=1e-3, n_layer=N_LAYER):
    return {
        "seed": seed,
        "arch": {"name": arch},
        "norm": {"name": "layernorm"},
        "optim": {"name": "adamw", "lr": lr},
        "model": {"n_layer": n_layer, "d_model": 64},
        "sched": {"name": "cosine", "warmup_steps": 10},
    }


BEST = "best val loss (= final in every run)"  # the main table's column when no run's final loss is above its best
BASELINE = 3.0  # the no-context loss the fake runs must beat by 0.1 to count as learned


def summary_for(records, arch, seed, status="completed", reason="", spikes=0):
    """What the trainer writes, without ``outcome`` (the report works it out from the baseline)."""
    vals = [r["val_loss"] for r in records if "val_loss" in r]
    return {
        "status": status,
        "reason": reason,
        "step": records[-1]["step"],
        "tokens": records[-1]["tokens"],
        "final_loss": records[-1]["loss"],
        "final_val_loss": vals[-1],
        "best_val_loss": min(vals),
        "tokens_per_s": 1234.0 + seed,
        "wall_s": 10.0,
        "n_params": 1000,
        "arch": arch,
        "norm": "layernorm",
        "optim": "adamw",
        "seed": seed,
        "device": "cpu",
        "precision": "fp32",
        "spikes": spikes,
        "baseline_loss": BASELINE,
    }


def table(md: str, first_header: str) -> dict[str, dict[str, str]]:
    """The markdown table whose first header cell is ``first_header``, as {first cell: row}."""
    lines = md.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    header = [c.strip() for c in lines[start].strip("|").split(" | ")]
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        rows[cells[0]] = dict(zip(header, cells))
    return rows


def mean_std(xs, single=".4f"):
    """mean ± std at the std's precision (analysis.numbers, tested on hand-computed values in test_report_answer)."""
    from normbench.analysis.numbers import pm

    return pm(statistics.fmean(xs), statistics.stdev(xs), single) if len(xs) > 1 else format(xs[0], single)


def best_of(row: dict) -> str:
    """The main table's best val loss cell, under either of its headers."""
    return row["best val loss"] if "best val loss" in row else row[BEST]


def check_png(path):
    import matplotlib.image

    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE), path
    img = matplotlib.image.imread(path)
    assert img.shape[0] > 100 and img.shape[1] > 100
    assert img.std() > 0  # not a blank canvas


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture
def sweep(tmp_path):
    """2 archs x 2 seeds completed, 1 diverged, 1 running (truncated metrics), 1 dead at start."""
    root = tmp_path / "multirun"
    summaries = {}
    job = 0
    for arch, base in (("pre_ln", 1.0), ("post_ln", 1.5)):
        for seed in (0, 1):
            recs = fake_records(base + 0.05 * seed)
            summaries[(arch, seed)] = summary_for(recs, arch, seed, spikes=seed)
            make_run(
                root / str(job), [f"arch={arch}", f"seed={seed}"], config(arch, seed), recs, summaries[(arch, seed)]
            )
            job += 1
    div = fake_records(2.0)[:5]
    div[-1]["loss"] = float("nan")  # json writes NaN; the reader and the plots must cope
    div_summary = summary_for(div, "deepnorm", 0, "diverged", "loss is nan at step 30")
    make_run(root / "4", ["arch=deepnorm", "seed=0"], config("deepnorm"), div, div_summary)
    running = fake_records(1.2)
    make_run(root / "5", ["arch=peri_ln", "seed=0"], config("peri_ln"), running, truncate=True)
    (root / "5" / ".lock").write_text(f"{socket.gethostname()}:{os.getpid()}")  # a live trainer holds it
    make_run(root / "6", ["arch=mix_ln", "seed=0"], config("mix_ln"))
    # killed -9 after a checkpoint: summary still says running, its dead process left the lock behind
    killed = fake_records(1.3)[:6]
    make_run(
        root / "7",
        ["arch=hybridnorm", "seed=0"],
        config("hybridnorm"),
        killed,
        {**summary_for(killed, "hybridnorm", 0), "status": "running"},
    )
    (root / "7" / ".lock").write_text(f"{socket.gethostname()}:{dead_pid()}")
    return root, summaries, running


def test_read_metrics_skips_corrupt_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "loss": 5.0}\nnot json\n[1, 2]\n{"loss": 1}\n{"step": 10, "loss": 4.0}\n{"st')
    assert [r["step"] for r in report.read_metrics(path)] == [0, 10]
    assert report.read_metrics(tmp_path / "missing.jsonl") == []


def test_sweep_report_table(sweep):
    root, summaries, running = sweep
    md_path = report.make_report(root, target_loss=2.0)
    assert md_path == root / "report.md"
    md = md_path.read_text()
    rows = table(md, "group")
    assert set(rows) == {f"arch={a}" for a in ("pre_ln", "post_ln", "deepnorm", "peri_ln", "mix_ln", "hybridnorm")}

    for arch in ("pre_ln", "post_ln"):
        row, s = rows[f"arch={arch}"], [summaries[(arch, seed)] for seed in (0, 1)]
        assert row["runs"] == "2" and row["status"] == "2 completed"
        # best val 1.6-2.2 < baseline 3.0 - 0.1; seed 1 had a spike
        assert row["outcomes"] == "1 learned, 1 unstable"
        # every run ended at its best val loss: one column says both
        assert all(x["final_val_loss"] == x["best_val_loss"] for x in s) and "final val loss" not in row
        assert row[BEST] == mean_std([x["best_val_loss"] for x in s])
        assert row["tokens/s"] == f"{statistics.fmean(x['tokens_per_s'] for x in s):,.0f}"
        assert row["spikes"] == str(sum(x["spikes"] for x in s))
        # the step where val loss crosses the target, interpolated between evals, over the seeds that reach it
        reached = []
        for seed in (0, 1):
            recs = report.read_metrics(root / str(["pre_ln", "post_ln"].index(arch) * 2 + seed) / "metrics.jsonl")
            ev = [(r["step"], r["val_loss"]) for r in recs if "val_loss" in r]
            for (s0, v0), (s1, v1) in zip(ev, ev[1:]):
                if v0 > 2.0 >= v1:
                    reached.append(s0 + (v0 - 2.0) / (v0 - v1) * (s1 - s0))
                    break
        expected = "—" if not reached else (f"{reached[0]:.0f}" if len(reached) == 1 else mean_std(reached, ".0f"))
        if reached and len(reached) < 2:
            expected += f" ({len(reached)}/2)"
        assert row["steps to val loss ≤ 2"] == expected

    # diverged, running and dead runs are shown, not dropped
    div = rows["arch=deepnorm"]
    assert div["status"] == "1 diverged" and div["outcomes"] == "1 diverged"
    assert div[BEST] == "—" and "loss is nan at step 30" in div["notes"]
    run = rows["arch=peri_ln"]
    assert run["status"] == "1 running" and run["outcomes"] == "1 running"
    best_so_far = min(r["val_loss"] for r in running if "val_loss" in r)
    assert run[BEST] == f"{best_so_far:.4f} (partial)"
    assert rows["arch=mix_ln"]["status"] == "1 failed" and "no data" in rows["arch=mix_ln"]["notes"]
    killed = rows["arch=hybridnorm"]
    # killed: resumable, not a failure; its note says how far it got and the command that resumes it
    assert killed["status"] == "1 stopped" and killed["outcomes"] == "1 stopped"
    assert "stopped: died without a word after logging step 40" in killed["notes"]
    assert (
        f"resume with: python -m normbench train arch=hybridnorm seed=0 hydra.run.dir={root / '7'}" in killed["notes"]
    )

    # sorted by best val loss; groups without one come last
    bests = [rows[label][BEST].split(" ")[0] for label in rows]
    numeric = [float(b) for b in bests if b != "—"]
    assert numeric == sorted(numeric) and bests[len(numeric) :] == ["—"] * (len(bests) - len(numeric))
    assert "Largest learning rate" not in md  # lr does not vary
    assert not (root / "lr_sweep.png").exists()

    # every group table has the outcome counts; the all-runs table the outcome of each run
    target_rows = table(md.split("## Time to target")[1], "group")
    assert target_rows["arch=deepnorm"]["outcomes"] == "1 diverged" and target_rows["arch=deepnorm"]["reached"] == "0/1"
    assert target_rows["arch=pre_ln"]["outcomes"] == "1 learned, 1 unstable"
    runs = all_runs(md)
    assert runs["0"]["outcome"] == "learned" and runs["1"]["outcome"] == "unstable"
    assert runs["4"]["outcome"] == "diverged" and runs["5"]["outcome"] == "—"


def test_sweep_report_plots_and_html(sweep):
    root, summaries, running = sweep
    out = root / "out"
    assert report.main([str(root), "--out", str(out)]) == 0
    pngs = [
        "loss_curves.png",
        "lr_grad_norm.png",
        "var_resid_depth.png",
        "grad_norm_layer_depth.png",
        "maxabs_resid_depth.png",
        "grad_norm_layer_heatmap.png",
        "var_resid_heatmap.png",
        "layer_stats.png",
    ]
    for name in pngs:
        check_png(out / name)
    page = (out / "report.html").read_text()
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == len(pngs)
    assert all(base64.b64decode(img).startswith(PNG_SIGNATURE) for img in images)
    assert "<table>" in page and "arch=deepnorm" in page and "1 diverged" in page
    # the default target: the largest best val loss among the runs that learned, rounded up to 2 decimals
    learned = [summaries[(arch, seed)]["best_val_loss"] for arch in ("pre_ln", "post_ln") for seed in (0, 1)]
    target = math.ceil(round(max(learned) * 100, 6)) / 100
    md = (out / "report.md").read_text()
    assert f"steps to val loss ≤ {target:g}" in md
    # every learned run reached it; the running one (not learned yet) did not
    runs = all_runs(md)
    assert all(runs[name]["steps to target"] != "not reached" for name in ("0", "1", "2", "3"))
    # the per-layer table: var growth Var(h_3)/Var(h_1) at the last diag step (100): (4 + 1) / (2 + 1)
    layer = table(md.split("## Per-layer statistics")[1], "group")
    # both seeds have the same profile: a std of 0 is no spread to show
    assert layer["arch=pre_ln"]["variance growth (last/first block)"] == f"{5 / 3:.3g}"
    assert layer["arch=pre_ln"]["grad spread (first/last block)"] == f"{0.1 / 0.3:.3g}"
    assert layer["arch=pre_ln"]["first step massive ratio > 100"] == "never"
    assert layer["arch=pre_ln"]["outcomes"] == "1 learned, 1 unstable"


@pytest.mark.slow
def test_lr_sweep_largest_lr_where_every_seed_learned(tmp_path):
    root = tmp_path / "lr"
    lrs = (1e-3, 3e-3, 1e-2, 3e-2)
    bad = {
        ("pre_ln", 1e-2): "diverged",
        ("pre_ln", 3e-2): "diverged",
        ("post_ln", 3e-3): "stuck",
        ("post_ln", 1e-2): "spiky",
        ("pre_ln", 1e-3): "stuck",
    }
    job = 0
    for arch in ("pre_ln", "post_ln"):
        for lr in lrs:
            for seed in (0, 1):
                what = bad.get((arch, lr)) if seed == 1 else None  # one bad seed is enough
                recs = fake_records(1.0 + lr * 10 + seed * 0.01)
                s = summary_for(
                    recs,
                    arch,
                    seed,
                    "diverged" if what == "diverged" else "completed",
                    "loss spike",
                    spikes=2 if what == "spiky" else 0,
                )
                if what == "stuck":
                    s["best_val_loss"] = BASELINE - 0.05
                make_run(
                    tmp_path / "lr" / str(job),
                    [f"arch={arch}", f"optim.lr={lr}", f"seed={seed}"],
                    config(arch, seed, lr),
                    recs,
                    s,
                )
                job += 1
    md = report.make_report(root).read_text()
    rows = table(md, "group")
    assert len(rows) == 8 and f"arch=pre_ln optim.lr={1e-3!r}" in rows
    assert rows[f"arch=pre_ln optim.lr={1e-3!r}"]["outcomes"] == "1 learned, 1 stuck"
    lr_rows = table(md.split("Largest learning rate at which every seed learned")[1], "group")
    # pre_ln: 1e-3 has a stuck seed, 3e-3 all learned, 1e-2 diverged -> 3e-3 (not the lower, not above a failure)
    # post_ln: 3e-3 stuck, 1e-2 unstable (spikes), 3e-2 all learned -> 3e-2: the largest that learned everywhere
    assert lr_rows["arch=pre_ln"]["largest lr where every seed learned"] == "0.003"
    assert lr_rows["arch=post_ln"]["largest lr where every seed learned"] == "0.03"
    assert lr_rows["arch=pre_ln"]["outcomes by learning rate"] == (
        "0.001: 1 learned, 1 stuck; 0.003: 2 learned; 0.01: 1 learned, 1 diverged; 0.03: 1 learned, 1 diverged"
    )
    assert "0.01: 1 learned, 1 unstable" in lr_rows["arch=post_ln"]["outcomes by learning rate"]
    check_png(root / "lr_sweep.png")


@pytest.mark.slow
def test_resumed_job_stays_in_its_group_and_tokens_per_s_averages_the_completed_runs(tmp_path):
    """trainer.resume=true on one job is bookkeeping, not a setting; a diverged seed's early
    throughput does not enter the group's tokens/s (the table averages completed runs only)."""
    root = tmp_path / "sweep"
    recs = [fake_records(1.0 + 0.01 * seed) for seed in (0, 1, 2)]
    extra = ([], ["trainer.resume=true", "trainer.resume_allow_changed=[trainer.max_steps]"], [])
    for seed in (0, 1, 2):
        status = "diverged" if seed == 2 else "completed"
        s = summary_for(recs[seed], "pre_ln", seed, status, "loss spike")
        if status == "diverged":
            s["tokens_per_s"] = None  # diverged before the steady-state window
            recs[seed][-1]["tokens_per_s"] = 99_999.0
        make_run(root / str(seed), ["arch=pre_ln", f"seed={seed}", *extra[seed]], config(seed=seed), recs[seed], s)
    rows = table(report.make_report(root).read_text(), "group")
    assert list(rows) == ["arch=pre_ln norm=layernorm"]
    row = rows["arch=pre_ln norm=layernorm"]
    assert row["runs"] == "3" and row["status"] == "2 completed, 1 diverged"
    assert row["tokens/s"] == f"{statistics.fmean([1234.0, 1235.0]):,.0f}"


@pytest.mark.slow
def test_optimizer_sweep_is_not_an_lr_sweep_and_lr_stability_needs_a_learned_run(tmp_path):
    root = tmp_path / "optim"
    for job, (name, lr) in enumerate((("adamw", 2e-3), ("lion", 3e-4))):
        recs = fake_records(1.0 + job)
        make_run(
            root / str(job),
            [f"optim={name}"],
            {**config(lr=lr), "optim": {"name": name, "lr": lr}},
            recs,
            {**summary_for(recs, "pre_ln", 0), "optim": name},
        )
    md = report.make_report(root).read_text()
    assert "Largest learning rate" not in md and not (root / "lr_sweep.png").exists()

    root = tmp_path / "lr"  # lr 1e-3: one learned, one still running; 1e-2: one crashed (failed), none done
    runs = [(1e-3, 0, "completed"), (1e-3, 1, "running"), (1e-2, 0, "failed")]
    for job, (lr, seed, status) in enumerate(runs):
        recs = fake_records(1.0 + seed)
        summary = summary_for(recs, "pre_ln", seed, status, "crash" if status == "failed" else "")
        make_run(root / str(job), [f"optim.lr={lr}", f"seed={seed}"], config(seed=seed, lr=lr), recs, summary)
    md = report.make_report(root).read_text()
    row = table(md.split("Largest learning rate at which every seed learned")[1], "group")["arch=pre_ln norm=layernorm"]
    # the running one has no live process: stopped. A crash says nothing about the lr: 1e-2 has no outcome at all
    assert row["outcomes by learning rate"] == "0.001: 1 learned, 1 stopped; 0.01: 1 failed"
    assert row["largest lr where every seed learned"] == "0.001 (1 stopped)"


@pytest.mark.slow
def test_depth_plot_draws_a_group_whose_runs_all_diverged(tmp_path):
    recs = fake_records(1.0, steps=60)
    make_run(
        tmp_path / "0",
        ["arch=post_ln"],
        config("post_ln"),
        recs,
        summary_for(recs, "post_ln", 0, "diverged", "loss spike"),
    )
    md = report.make_report(tmp_path, steps=[50]).read_text()
    assert "var_resid_depth.png` skipped" not in md
    check_png(tmp_path / "var_resid_depth.png")
    check_png(tmp_path / "loss_curves.png")


@pytest.mark.slow
def test_single_run_and_different_depths(tmp_path):
    run = make_run(tmp_path / "run", [], config(), fake_records(1.0), summary_for(fake_records(1.0), "pre_ln", 0))
    md = report.make_report(run).read_text()
    assert "arch=pre_ln norm=layernorm" in table(md, "group")

    root = tmp_path / "depth"
    for job, n_layer in enumerate((2, 6)):
        recs = fake_records(1.0, n_layer=n_layer)
        make_run(
            root / str(job), [f"model.n_layer={n_layer}"], config(n_layer=n_layer), recs, summary_for(recs, "pre_ln", 0)
        )
    md = report.make_report(root, steps=[50]).read_text()
    assert set(table(md, "group")) == {"model.n_layer=2", "model.n_layer=6"}
    check_png(root / "var_resid_depth.png")


def test_missing_metric_plots_are_skipped_with_a_note(tmp_path):
    recs = [{k: v for k, v in r.items() if not isinstance(v, list)} for r in fake_records(1.0)]
    make_run(tmp_path / "run", ["arch=pre_ln"], config(), recs, summary_for(recs, "pre_ln", 0))
    md = report.make_report(tmp_path).read_text()
    assert "`var_resid_depth.png` skipped" in md and not (tmp_path / "var_resid_depth.png").exists()
    check_png(tmp_path / "loss_curves.png")


def test_errors(tmp_path, capsys):
    assert report.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("normbench: error: ")
    assert report.main([str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("normbench: error: ") and err.count("\n") == 1


# ------------------------------------------------------------------ real sweeps (subprocess)
REAL = [
    "model=tiny",
    "trainer.max_steps=20",
    "diag.every=5",
    "trainer.eval_every=10",
    "trainer.log_every=5",
    "trainer.batch_size=8",
]
SWEEP_DIR = re.compile(r"outputs/multirun/\d{4}-\d\d-\d\d/\d\d-\d\d-\d\d-\d{6}$")


def all_runs(md: str) -> dict[str, dict[str, str]]:
    return table(md.split("## All runs", 1)[1], "run")


def test_report_on_a_real_sweep_while_it_runs_and_after(tmp_path):
    """`train -m arch=pre_ln,post_ln seed=0,1` (4 jobs), `report` while it runs, and at the end."""
    cmd = [sys.executable, "-m", "normbench", "train", "-m", "arch=pre_ln,post_ln", "seed=0,1", *REAL]
    proc = subprocess.Popen(
        cmd,
        cwd=tmp_path,
        env={**os.environ, **OFFLINE_ENV},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    mid = None
    try:
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:
            if list(tmp_path.glob("outputs/multirun/*/*/*/metrics.jsonl")):  # a job has started logging
                sweep = next(tmp_path.glob("outputs/multirun/*/*"))
                assert report.main([str(sweep), "--out", str(tmp_path / "mid")]) == 0
                mid = (tmp_path / "mid" / "report.md").read_text(), proc.poll() is None
                break
            time.sleep(0.05)
        out = proc.communicate(timeout=max(deadline - time.monotonic(), 1))[0]
    finally:
        proc.kill()
    assert proc.returncode == 0, out

    (sweep,) = tmp_path.glob("outputs/multirun/*/*")
    assert SWEEP_DIR.search(sweep.relative_to(tmp_path).as_posix())
    jobs = sorted((p for p in sweep.iterdir() if p.is_dir()), key=lambda p: int(p.name.split("_")[0]))
    rest = (
        "diag.every=5,model=tiny,seed={},trainer.batch_size=8,trainer.eval_every=10,trainer.log_every=5,"
        "trainer.max_steps=20"
    )
    assert [j.name for j in jobs] == [
        f"{i}_arch={a},{rest.format(s)}"
        for i, (a, s) in enumerate([("pre_ln", 0), ("pre_ln", 1), ("post_ln", 0), ("post_ln", 1)])
    ]

    if mid is not None:  # the sweep was still going: the runs found so far, none dropped or misread
        md, was_running = mid
        runs = all_runs(md)
        assert 1 <= len(runs) <= 4 and set(runs) <= {j.name for j in jobs}
        assert all(r["status"] in ("completed", "running") for r in runs.values()), runs
        assert not was_running or len(runs) < 4 or any(r["status"] == "running" for r in runs.values())

    assert report.main([str(sweep)]) == 0
    md = (sweep / "report.md").read_text()
    rows = table(md, "group")
    assert list(rows) == sorted(rows, key=lambda g: float(best_of(rows[g]).split()[0]))
    assert set(rows) == {"arch=pre_ln", "arch=post_ln"}
    summaries = {j.name: json.loads((j / "summary.json").read_text()) for j in jobs}
    # the seeds' tokens/s are the machine's: when one group's differ by more than 20% (other work on the cores, as
    # under CI) the machine was loaded for the whole sweep, and every group's cell carries its range and says so
    # (report/tables.sweep_loaded); plain otherwise
    by_arch = {a: [s["tokens_per_s"] for s in summaries.values() if s["arch"] == a] for a in ("pre_ln", "post_ln")}
    sweep_loaded = any(max(tps) > 1.2 * min(tps) for tps in by_arch.values())
    for arch in ("pre_ln", "post_ln"):
        mine = [s for s in summaries.values() if s["arch"] == arch]
        assert {s["status"] for s in mine} == {"completed"} and sorted(s["seed"] for s in mine) == [0, 1]
        row = rows[f"arch={arch}"]
        assert row["runs"] == "2" and row["status"] == "2 completed"
        # 20 steps of the tiny model stay at the unigram plateau (~3.0 nats on these bytes): stuck
        assert {s["outcome"] for s in mine} == {"stuck"} and row["outcomes"] == "2 stuck"
        assert all(s["best_val_loss"] > s["baseline_loss"] - s["stuck_margin"] for s in mine)
        assert best_of(row) == mean_std([s["best_val_loss"] for s in mine])
        if "final val loss" in row:  # the column is there when some run's final loss is above its best
            assert row["final val loss"] == mean_std([s["final_val_loss"] for s in mine])
        else:
            assert all(s["final_val_loss"] == s["best_val_loss"] for s in mine)
        tps = by_arch[arch]
        mean = f"{statistics.fmean(tps):,.0f}"
        loaded = f"{mean} ({min(tps):,.0f}-{max(tps):,.0f}: measured on a loaded machine)"
        assert row["tokens/s"] == (loaded if sweep_loaded else mean), (row["tokens/s"], by_arch)
    runs = all_runs(md)
    assert set(runs) == set(summaries)
    for name, s in summaries.items():
        assert runs[name]["seed"] == str(s["seed"]) and runs[name]["step"] == "20" == str(s["step"])
        assert runs[name]["group"] == f"arch={s['arch']}" and runs[name]["status"] == "completed"
        assert runs[name]["outcome"] == "stuck" and runs[name]["steps to target"] == "—"  # no run learned: no target
    assert "no run learned; give --target" in md
    pngs = [
        "loss_curves.png",
        "lr_grad_norm.png",
        "var_resid_depth.png",
        "grad_norm_layer_depth.png",
        "maxabs_resid_depth.png",
        "grad_norm_layer_heatmap.png",
        "var_resid_heatmap.png",
        "layer_stats.png",
    ]
    for name in pngs:
        check_png(sweep / name)
    assert len(re.findall(r'src="data:image/png;base64,', (sweep / "report.html").read_text())) == len(pngs)


@pytest.mark.slow
def test_report_on_a_partly_failed_real_sweep(tmp_path):
    """Failed (start-up error) and diverged jobs never stop a sweep; the report shows them."""
    sweep = tmp_path / "sweep"
    run_cli(
        [
            "train",
            "-m",
            "optim.lr=1e-3,50",
            "model.seq_len=32,300000",
            *REAL,
            "trainer.max_steps=10",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=tmp_path,
        check=True,
    )
    status = {}
    for job in sweep.iterdir():
        if job.is_dir():
            ovr = dict(o.split("=", 1) for o in yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text()))
            s = json.loads((job / "summary.json").read_text())
            status[(ovr["model.seq_len"], ovr["optim.lr"])] = (s["status"], s.get("reason") or "")
    assert len(status) == 4 and status[("32", "0.001")][0] == "completed"
    assert status[("32", "50")][0] == "diverged" and "initial loss" in status[("32", "50")][1]
    for rate in ("0.001", "50"):
        assert status[("300000", rate)][0] == "failed"
        assert "longer than the validation split" in status[("300000", rate)][1]

    assert report.main([str(sweep)]) == 0
    md = (sweep / "report.md").read_text()
    rows = table(md, "group")
    assert rows["optim.lr=0.001 model.seq_len=32"]["status"] == "1 completed"
    assert rows["optim.lr=0.001 model.seq_len=32"]["outcomes"] == "1 stuck"  # 10 steps: still at the unigram plateau
    diverged = rows["optim.lr=50 model.seq_len=32"]
    assert diverged["status"] == "1 diverged" and diverged["outcomes"] == "1 diverged"
    assert best_of(diverged) == "—"
    for rate in ("0.001", "50"):
        failed = rows[f"optim.lr={rate} model.seq_len=300000"]
        assert failed["status"] == "1 failed" and "longer than the validation split" in failed["notes"]
    lr_rows = table(md.split("Largest learning rate at which every seed learned")[1], "group")
    # completed at 1e-3 but stuck: not counted as a learning rate that works (the old "stable" did)
    assert lr_rows["model.seq_len=32"]["largest lr where every seed learned"] == "—"
    assert lr_rows["model.seq_len=32"]["outcomes by learning rate"] == "0.001: 1 stuck; 50: 1 diverged"
    assert lr_rows["model.seq_len=300000"]["largest lr where every seed learned"] == "—"
    assert lr_rows["model.seq_len=300000"]["outcomes by learning rate"] == "0.001: 1 failed; 50: 1 failed"
    for name in ("loss_curves.png", "var_resid_depth.png", "lr_sweep.png"):
        check_png(sweep / name)


def test_bookkeeping_keys_are_the_ones_hydra_leaves_out_of_job_dir_names():
    from normbench.config.files import config_dir
    from normbench.run.resume import BOOKKEEPING_KEYS

    hydra_cfg = yaml.safe_load((config_dir() / "config.yaml").read_text())["hydra"]
    assert hydra_cfg["job"]["config"]["override_dirname"]["exclude_keys"] == list(BOOKKEEPING_KEYS)


def test_run_held_from_another_host_says_where_and_how_stale(tmp_path):
    recs = fake_records(1.0)[:4]
    run = make_run(tmp_path / "0", ["arch=pre_ln"], config(), recs)
    (run / ".lock").write_text("gpu-node-17:4242")
    old = time.time() - 30 * 60
    os.utime(run / "metrics.jsonl", (old, old))
    loaded = report.load_run(run)
    assert loaded.status == "running"  # liveness cannot be checked across hosts
    assert loaded.reason == f"no summary yet, at step {recs[-1]['step']} (on gpu-node-17, last write 30 min ago)"


# ------------------------------------------------------------------ time to target, merging, grouping, baseline


def test_time_to_target_interpolates_between_evaluations(tmp_path):
    records = [
        {"step": 1, "tokens": 100, "loss": 5.0, "time_s": 1.0, "val_loss": 5.0},
        {"step": 5, "tokens": 500, "loss": 4.0, "time_s": 2.0},  # no eval: not a point of the val curve
        {"step": 10, "tokens": 1000, "loss": 3.0, "time_s": 4.0, "val_loss": 3.0},
        {"step": 20, "tokens": 2000, "loss": 2.0, "time_s": 10.0, "val_loss": 2.0},
        {"step": 30, "tokens": 3000, "loss": 2.5, "time_s": 13.0, "val_loss": 2.5},
    ]
    run = report.load_run(make_run(tmp_path / "r", [], config(), records, summary_for(records, "pre_ln", 0)))
    # 2.5 lies halfway from 3.0 (step 10) to 2.0 (step 20): step 15, 1500 tokens, 7 s
    hit = report.time_to_target(run, 2.5)
    assert (hit.steps, hit.tokens, hit.seconds) == (15.0, 1500.0, 7.0)
    # a quarter of the way from 5.0 (step 1) to 3.0 (step 10): step 3.25, 325 tokens, 1.75 s
    hit = report.time_to_target(run, 4.5)
    assert (hit.steps, hit.tokens, hit.seconds) == (3.25, 325.0, 1.75)
    hit = report.time_to_target(run, 2.0)  # met exactly at an evaluation
    assert (hit.steps, hit.tokens, hit.seconds) == (20.0, 2000.0, 10.0)
    hit = report.time_to_target(run, 6.0)  # already at the first evaluation
    assert (hit.steps, hit.tokens, hit.seconds) == (1.0, 100.0, 1.0)
    assert report.time_to_target(run, 1.9) is None  # never reached
    assert report.time_to_target(run, None) is None

    md = report.make_report(tmp_path / "r", target_loss=1.9, figures_too=False).read_text()
    row = all_runs(md)["r"]
    assert row["steps to target"] == row["tokens to target"] == row["seconds to target"] == "not reached"
    assert table(md.split("## Time to target")[1], "group")["arch=pre_ln norm=layernorm"]["reached"] == "0/1"
    md = report.make_report(tmp_path / "r", target_loss=2.5, figures_too=False).read_text()
    row = table(md.split("## Time to target")[1], "group")["arch=pre_ln norm=layernorm"]
    assert (row["reached"], row["steps"], row["tokens"], row["seconds"]) == ("1/1", "15", "1,500", "7.0")


def _sweep(root, arch_seeds, base=1.0, best=None):
    """A fake sweep dir: one job per (arch, seed); ``best`` maps (arch, seed) to a best val loss."""
    for job, (arch, seed) in enumerate(arch_seeds):
        recs = fake_records(base + 0.1 * seed)
        s = summary_for(recs, arch, seed)
        if best:
            s["best_val_loss"] = best[(arch, seed)]
        make_run(root / str(job), [f"arch={arch}", f"seed={seed}"], config(arch, seed), recs, s)
    return root


@pytest.mark.slow
def test_report_merges_two_sweep_dirs_filters_and_groups(tmp_path):
    a = _sweep(tmp_path / "a", [("pre_ln", 0), ("pre_ln", 1)])
    b = _sweep(tmp_path / "b", [("pre_ln", 2), ("post_ln", 0), ("post_ln", 1)])
    out = tmp_path / "out"
    proc = run_cli(["report", str(a), str(b), str(a / "0"), "--out", str(out)], cwd=tmp_path)  # a/0 twice: once
    assert proc.returncode == 0, proc.stderr
    md = (out / "report.md").read_text()
    rows = table(md, "group")
    assert set(rows) == {"arch=pre_ln", "arch=post_ln"}
    assert rows["arch=pre_ln"]["runs"] == "3" and rows["arch=post_ln"]["runs"] == "2"
    assert set(all_runs(md)) == {"a/0", "a/1", "b/0", "b/1", "b/2"}  # named relative to the common parent
    for name in ("loss_curves.png", "var_resid_heatmap.png", "layer_stats.png"):
        check_png(out / name)

    # --filter keeps matching runs; --group-by picks the keys (here: one group per seed)
    md = report.make_report([a, b], out=out, filters=["arch=pre_ln"], figures_too=False).read_text()
    assert set(table(md, "group")) == {"arch=pre_ln norm=layernorm"} and len(all_runs(md)) == 3
    md = report.make_report([a, b], out=out, group_by=["seed"], figures_too=False).read_text()
    rows = table(md, "group")
    assert set(rows) == {"seed=0", "seed=1", "seed=2"} and rows["seed=0"]["runs"] == "2"
    md = report.make_report(
        [a, b], out=out, group_by=["arch", "seed"], filters=["seed=0,2"], figures_too=False
    ).read_text()
    assert set(table(md, "group")) == {"arch=pre_ln seed=0", "arch=post_ln seed=0", "arch=pre_ln seed=2"}
    assert report.make_report(a, figures_too=False) == a / "report.md"  # default out: the (first) directory

    # bad flags: one line naming the key and what there is
    for argv, words in [
        (["--filter", "arhc=pre_ln"], ["--filter", "'arhc'", "arch"]),
        (["--filter", "arch=deepnorm"], ["no run matches", "post_ln, pre_ln"]),
        (["--filter", "arch"], ["KEY=VALUE"]),
        (["--group-by", "nope"], ["--group-by", "'nope'"]),
        (["--baseline", "arch=deepnorm"], ["no group has arch=deepnorm", "post_ln, pre_ln"]),
        (
            ["--baseline", "arch=preln"],
            ["no group has arch=preln (did you mean arch=pre_ln?); choose one of: post_ln, pre_ln"],
        ),
        (["--baseline", "ach=pre_ln"], ["'ach' is not a grouping key (did you mean arch?)"]),
        (["--baseline", "norm=layernorm"], ["'norm' is not a grouping key", "arch"]),
        (["--color-by", "colour"], ["--color-by", "'colour'"]),
    ]:
        proc = run_cli(["report", str(a), str(b), "--out", str(out), "--no-figures", *argv], cwd=tmp_path)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, (argv, proc.stderr)
        assert proc.stderr.startswith("normbench: error: ") and all(w in proc.stderr for w in words), proc.stderr


def test_baseline_difference_with_welch_interval(tmp_path):
    from scipy import stats as scipy_stats

    best = {
        ("pre_ln", 0): 1.0,
        ("pre_ln", 1): 1.2,
        ("pre_ln", 2): 1.4,
        ("post_ln", 0): 2.0,
        ("post_ln", 1): 2.1,
        ("post_ln", 2): 2.3,
        ("peri_ln", 0): 0.9,
    }
    root = _sweep(tmp_path / "s", list(best), best=best)
    md = report.make_report(root, baseline="arch=pre_ln", figures_too=False).read_text()
    rows = table(md.split("## Difference from arch=pre_ln")[1], "group")
    # by hand: means 2.1333 - 1.2 = 0.9333; variances 0.0233/3 and 0.04/3; Welch df = 3.74
    a, b = [2.0, 2.1, 2.3], [1.0, 1.2, 1.4]
    va, vb = statistics.variance(a) / 3, statistics.variance(b) / 3
    df = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 2)
    assert df == pytest.approx(3.7409, abs=1e-4)
    half = scipy_stats.t.ppf(0.975, df) * math.sqrt(va + vb)
    diff = statistics.fmean(a) - statistics.fmean(b)
    assert diff == pytest.approx(0.9333, abs=1e-4)
    # the same interval as scipy's Welch test computes it
    ci = scipy_stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert (diff - half, diff + half) == pytest.approx((ci.low, ci.high))
    row = rows["arch=post_ln"]
    # shown at the half-width's precision: 0.41 has one significant figure, so one decimal
    assert half == pytest.approx(0.4147, abs=1e-4)
    assert row["Δ best val loss [95% CI]"] == "+0.9 [+0.5, +1.3]"
    assert row["baseline"] == "arch=pre_ln" and row["outcomes"] == "3 learned"
    assert rows["arch=pre_ln"]["Δ best val loss [95% CI]"] == "(baseline)"
    assert rows["arch=peri_ln"]["Δ best val loss [95% CI]"] == f"{0.9 - 1.2:+.4f} (n=1 vs 3: no interval)"
    d = report.welch_interval([1.0, 1.0], [2.0, 2.0])  # no spread: a point interval
    assert (d.diff, d.low, d.high) == (-1.0, -1.0, -1.0)


def test_a_batchnorm_run_row_says_it_leaked(tmp_path):
    """norm=batchnorm trains only with norm.allow_leak=true; its report rows say the result leaked."""
    for job, norm in enumerate(("batchnorm", "rmsnorm")):
        recs = fake_records(1.0 + job)
        cfg = {**config(), "norm": {"name": norm, "allow_leak": norm == "batchnorm"}}
        overrides = [f"norm={norm}"] + (["norm.allow_leak=true"] if norm == "batchnorm" else [])
        make_run(tmp_path / str(job), overrides, cfg, recs, {**summary_for(recs, "pre_ln", 0), "norm": norm})
    md = report.make_report(tmp_path, figures_too=False).read_text()
    rows = table(md, "group")
    leak = next(row for label, row in rows.items() if "batchnorm" in label)
    assert "leaks the future" in leak["notes"] and "allow_leak" in leak["notes"]
    assert next(row for label, row in rows.items() if "rmsnorm" in label)["notes"] == ""
    runs = table(md, "run")
    assert "leaks the future" in runs["0"]["reason"] and "leaks" not in runs["1"]["reason"]


# ----------------------------------------------------------------------------- figures at a paper's column width


def svg_sizes(path) -> tuple[float, list[float]]:
    """(the figure's width in inches, every text's font size in points) of an SVG figure: matplotlib writes
    the width in pt and, with svg.fonttype none, each text's size in the same user units."""
    text = path.read_text()
    width = float(re.search(r'<svg[^>]* width="([\d.]+)pt"', text).group(1)) / 72
    return width, [float(x) for x in re.findall(r"font-size:\s*([\d.]+)px", text)]


def test_figures_at_a_single_column_have_no_text_under_7_pt(sweep, tmp_path):
    root, _, _ = sweep
    recs = fake_records(1.0)
    for job, lr in enumerate((1e-3, 1e-2)):  # and a learning-rate figure, with its log x axis
        make_run(tmp_path / "lr" / str(job), [f"optim.lr={lr}"], config(lr=lr), recs, summary_for(recs, "pre_ln", 0))
    for runs, out in ((root, tmp_path / "col"), (tmp_path / "lr", tmp_path / "lrcol")):
        assert report.main([str(runs), "--out", str(out), "--width", "3.3", "--format", "svg", "--dpi", "50"]) == 0
    svgs = sorted((tmp_path / "col").glob("*.svg")) + sorted((tmp_path / "lrcol").glob("*.svg"))
    assert {p.stem for p in svgs} >= {
        "loss_curves",
        "var_resid_depth",
        "grad_norm_layer_heatmap",
        "layer_stats",
        "lr_sweep",
    }
    for path in svgs:
        width, sizes = svg_sizes(path)
        assert width == pytest.approx(3.3, abs=0.01), path.name
        assert sizes and min(sizes) >= 7.0, (path.name, sorted(sizes)[:3])
    assert report.main([str(root), "--out", str(tmp_path / "x"), "--width", "1"]) == 2


def captured(monkeypatch):
    """The figures the report saves, kept open to look at (Output.save is where every figure ends)."""
    from normbench.report import figures

    figs, save = {}, figures.Output.save

    def keep(self, fig, path):
        figs[path.stem] = fig
        save(self, fig, path)

    monkeypatch.setattr(figures.Output, "save", keep)
    return figs


def test_one_scale_per_depth_figure_heatmaps_from_step_0_and_the_legend_in_the_sweeps_order(tmp_path, monkeypatch):
    for job, arch in enumerate(("post_ln", "pre_ln")):  # the sweep ran post_ln first
        recs = fake_records(1.0, diag_every=25)
        for r in recs:  # at step 0 the variance spans 100x over depth, later 4x: one panel alone needs a log axis
            if "var_resid" in r:
                r["var_resid"] = [10.0**i if r["step"] == 0 else 1.0 + i for i in range(N_LAYER + 1)]
        make_run(tmp_path / str(job), [f"arch={arch}"], config(arch), recs, summary_for(recs, arch, 0))
    figs = captured(monkeypatch)
    md = report.make_report(tmp_path, steps=[0, 50], width=3.3).read_text()
    depth = [ax for ax in figs["var_resid_depth"].axes if ax.axison]
    assert len(depth) == 3 and {ax.get_yscale() for ax in depth} == {"log"}
    heat = [ax for ax in figs["grad_norm_layer_heatmap"].axes if ax.get_xlabel() == "training step"]
    assert heat and all(ax.get_xlim()[0] == 0 for ax in heat)
    legend = figs["loss_curves"].legends[0]
    assert [t.get_text() for t in legend.get_texts()][:2] == ["arch = post_ln", "arch = pre_ln"]
    heat_caption = md.split("### `grad_norm_layer_heatmap.png`")[1].split("###")[0]
    assert "Heatmaps, one panel per group" in heat_caption and "line style" not in heat_caption
    assert "Colour: `arch`" in md.split("### `loss_curves.png`")[1].split("###")[0]
    page = (tmp_path / "report.html").read_text()
    assert f"<title>normbench report: arch, 2 runs ({tmp_path.name})</title>" in page
    assert 'alt="heatmaps of each block' in page and 'alt="var_resid"' not in page
