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
            {"step": step, "tokens": step * 512, "loss": loss, "lr": 1e-3, "grad_norm": 1.0 / (1 + step),
             "tokens_per_s": 1000.0 + step, "time_s": step * 0.1}
        )  # fmt: skip
        if step % diag_every == 0:
            records.append(
                {"step": step, "tokens": step * 512, "loss": loss, "lr": 1e-3, "grad_norm": 0.5,
                 "tokens_per_s": 1000.0 + step, "time_s": step * 0.1, "val_loss": loss + 0.1,
                 "grad_norm_layer": [0.1 * (i + 1) for i in range(n_layer)],
                 "grad_norm_attn": [0.05 * (i + 1) for i in range(n_layer)],
                 "grad_norm_mlp": [0.07 * (i + 1) for i in range(n_layer)],
                 "var_resid": [1.0 + i + step / 100 for i in range(n_layer + 1)],
                 "rms_resid": [1.0 + i for i in range(n_layer + 1)],
                 "maxabs_resid": [5.0 * (i + 1) for i in range(n_layer + 1)],
                 "massive_ratio_resid": [3.0 + i for i in range(n_layer + 1)]}
            )  # fmt: skip
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
    return {"seed": seed, "arch": {"name": arch}, "norm": {"name": "layernorm"},
            "optim": {"name": "adamw", "lr": lr}, "model": {"n_layer": n_layer, "d_model": 64},
            "sched": {"name": "cosine", "warmup_steps": 10}}  # fmt: skip


def summary_for(records, arch, seed, status="completed", reason="", spikes=0):
    vals = [r["val_loss"] for r in records if "val_loss" in r]
    return {"status": status, "reason": reason, "step": records[-1]["step"], "tokens": records[-1]["tokens"],
            "final_loss": records[-1]["loss"], "final_val_loss": vals[-1], "best_val_loss": min(vals),
            "tokens_per_s": 1234.0 + seed, "wall_s": 10.0, "n_params": 1000, "arch": arch,
            "norm": "layernorm", "optim": "adamw", "seed": seed, "device": "cpu", "precision": "fp32",
            "spikes": spikes}  # fmt: skip


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


def mean_std(xs):
    return f"{statistics.fmean(xs):.4f} ± {statistics.stdev(xs):.4f}" if len(xs) > 1 else f"{xs[0]:.4f}"


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
            make_run(root / str(job), [f"arch={arch}", f"seed={seed}"], config(arch, seed), recs,
                     summaries[(arch, seed)])  # fmt: skip
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
    make_run(root / "7", ["arch=hybridnorm", "seed=0"], config("hybridnorm"), killed,
             {**summary_for(killed, "hybridnorm", 0), "status": "running"})  # fmt: skip
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
        assert row["runs"] == "2" and row["status"] == "2 completed" and row["diverged"] == "0"
        assert row["final val loss"] == mean_std([x["final_val_loss"] for x in s])
        assert row["best val loss"] == mean_std([x["best_val_loss"] for x in s])
        assert row["tokens/s"] == f"{statistics.fmean(x['tokens_per_s'] for x in s):,.0f}"
        assert row["spikes"] == str(sum(x["spikes"] for x in s))
        # first step whose val loss <= target, averaged over the seeds that reach it
        firsts = []
        for seed in (0, 1):
            recs = report.read_metrics(root / str(["pre_ln", "post_ln"].index(arch) * 2 + seed) / "metrics.jsonl")
            firsts += [next((r["step"] for r in recs if r.get("val_loss", math.inf) <= 2.0), None)]
        reached = [f for f in firsts if f is not None]
        expected = f"{statistics.fmean(reached):.0f}" if reached else "—"
        if reached and len(reached) < 2:
            expected += f" ({len(reached)}/2)"
        assert row["steps to loss ≤ 2"] == expected

    # diverged, running and dead runs are shown, not dropped
    div = rows["arch=deepnorm"]
    assert div["status"] == "1 diverged" and div["diverged"] == "1"
    assert div["best val loss"] == "—" and "loss is nan at step 30" in div["notes"]
    run = rows["arch=peri_ln"]
    assert run["status"] == "1 running"
    best_so_far = min(r["val_loss"] for r in running if "val_loss" in r)
    assert run["best val loss"] == f"{best_so_far:.4f} (partial)"
    assert rows["arch=mix_ln"]["status"] == "1 failed" and "no data" in rows["arch=mix_ln"]["notes"]
    killed = rows["arch=hybridnorm"]
    assert killed["status"] == "1 failed" and "stopped at step 40 without finishing" in killed["notes"]

    # sorted by best val loss; groups without one come last
    bests = [rows[label]["best val loss"].split(" ")[0] for label in rows]
    numeric = [float(b) for b in bests if b != "—"]
    assert numeric == sorted(numeric) and bests[len(numeric) :] == ["—"] * (len(bests) - len(numeric))
    assert "Largest stable learning rate" not in md  # lr does not vary
    assert not (root / "lr_sweep.png").exists()


def test_sweep_report_plots_and_html(sweep):
    root, summaries, running = sweep
    out = root / "out"
    assert report.main([str(root), "--out", str(out)]) == 0
    pngs = ["loss_curves.png", "var_resid_depth.png", "grad_norm_layer_depth.png", "maxabs_resid_depth.png"]
    for name in pngs:
        check_png(out / name)
    page = (out / "report.html").read_text()
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == len(pngs)
    assert all(base64.b64decode(img).startswith(PNG_SIGNATURE) for img in images)
    assert "<table>" in page and "arch=deepnorm" in page and "1 diverged" in page
    # the default target is the median group best val loss, rounded up to 2 decimals
    # (completed groups: mean over seeds; the running group: its best so far; diverged/dead: none)
    bests = [statistics.fmean(summaries[(arch, seed)]["best_val_loss"] for seed in (0, 1))
             for arch in ("pre_ln", "post_ln")]  # fmt: skip
    bests.append(min(r["val_loss"] for r in running if "val_loss" in r))
    target = math.ceil(round(statistics.median(bests) * 100, 6)) / 100
    assert f"steps to loss ≤ {target:g}" in (out / "report.md").read_text()


def test_lr_sweep_largest_stable(tmp_path):
    root = tmp_path / "lr"
    lrs = (1e-3, 3e-3, 1e-2)
    diverges = {("pre_ln", 1e-2), ("post_ln", 3e-3), ("post_ln", 1e-2)}
    job = 0
    for arch in ("pre_ln", "post_ln"):
        for lr in lrs:
            for seed in (0, 1):
                recs = fake_records(1.0 + lr * 10 + seed * 0.01)
                bad = (arch, lr) in diverges and seed == 1  # one diverged seed makes the lr unstable
                s = summary_for(recs, arch, seed, "diverged" if bad else "completed", "loss spike")
                make_run(tmp_path / "lr" / str(job), [f"arch={arch}", f"optim.lr={lr}", f"seed={seed}"],
                         config(arch, seed, lr), recs, s)  # fmt: skip
                job += 1
    md = report.make_report(root).read_text()
    rows = table(md, "group")
    assert len(rows) == 6 and f"arch=pre_ln optim.lr={1e-3!r}" in rows
    lr_rows = table(md.split("Largest stable learning rate")[1], "group")
    for arch in ("pre_ln", "post_ln"):
        stable = max(lr for lr in lrs if (arch, lr) not in diverges)
        assert lr_rows[f"arch={arch}"]["largest stable lr"] == f"{stable:g}"
        assert lr_rows[f"arch={arch}"]["diverged at"] == ", ".join(f"{lr:g}" for lr in lrs if (arch, lr) in diverges)
    check_png(root / "lr_sweep.png")


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


def test_optimizer_sweep_is_not_an_lr_sweep_and_lr_stability_needs_a_completed_run(tmp_path):
    root = tmp_path / "optim"
    for job, (name, lr) in enumerate((("adamw", 2e-3), ("lion", 3e-4))):
        recs = fake_records(1.0 + job)
        make_run(root / str(job), [f"optim={name}"], {**config(lr=lr), "optim": {"name": name, "lr": lr}}, recs,
                 {**summary_for(recs, "pre_ln", 0), "optim": name})  # fmt: skip
    md = report.make_report(root).read_text()
    assert "Largest stable learning rate" not in md and not (root / "lr_sweep.png").exists()

    root = tmp_path / "lr"  # lr 1e-3: one completed, one still running; 1e-2: one crashed (failed), none done
    runs = [(1e-3, 0, "completed"), (1e-3, 1, "running"), (1e-2, 0, "failed")]
    for job, (lr, seed, status) in enumerate(runs):
        recs = fake_records(1.0 + seed)
        summary = summary_for(recs, "pre_ln", seed, status, "crash" if status == "failed" else "")
        make_run(root / str(job), [f"optim.lr={lr}", f"seed={seed}"], config(seed=seed, lr=lr), recs, summary)
    lr_rows = table(report.make_report(root).read_text().split("Largest stable learning rate")[1], "group")
    row = lr_rows["arch=pre_ln norm=layernorm"]
    assert row["learning rates tried"] == "0.001 (1 failed), 0.01 (1 failed)"  # the running one's lock is gone
    assert row["largest stable lr"] == "0.001 (1 failed)" and row["diverged at"] == "—"


def test_depth_plot_draws_a_group_whose_runs_all_diverged(tmp_path):
    recs = fake_records(1.0, steps=60)
    make_run(tmp_path / "0", ["arch=post_ln"], config("post_ln"), recs,
             summary_for(recs, "post_ln", 0, "diverged", "loss spike"))  # fmt: skip
    md = report.make_report(tmp_path, steps=[50]).read_text()
    assert "var_resid_depth.png` skipped" not in md
    check_png(tmp_path / "var_resid_depth.png")
    check_png(tmp_path / "loss_curves.png")


def test_single_run_and_different_depths(tmp_path):
    run = make_run(tmp_path / "run", [], config(), fake_records(1.0), summary_for(fake_records(1.0), "pre_ln", 0))
    md = report.make_report(run).read_text()
    assert "arch=pre_ln norm=layernorm" in table(md, "group")

    root = tmp_path / "depth"
    for job, n_layer in enumerate((2, 6)):
        recs = fake_records(1.0, n_layer=n_layer)
        make_run(root / str(job), [f"model.n_layer={n_layer}"], config(n_layer=n_layer), recs,
                 summary_for(recs, "pre_ln", 0))  # fmt: skip
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
REAL = ["model=tiny", "trainer.max_steps=20", "diag.every=5", "trainer.eval_every=10", "trainer.log_every=5",
        "trainer.batch_size=8"]  # fmt: skip
SWEEP_DIR = re.compile(r"outputs/multirun/\d{4}-\d\d-\d\d/\d\d-\d\d-\d\d-\d{6}$")


def all_runs(md: str) -> dict[str, dict[str, str]]:
    return table(md.split("## All runs", 1)[1], "run")


def test_report_on_a_real_sweep_while_it_runs_and_after(tmp_path):
    """`train -m arch=pre_ln,post_ln seed=0,1` (4 jobs), `report` while it runs, and at the end."""
    cmd = [sys.executable, "-m", "normbench", "train", "-m", "arch=pre_ln,post_ln", "seed=0,1", *REAL]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env={**os.environ, **OFFLINE_ENV}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
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
    assert [j.name for j in jobs] == [f"{i}_arch={a},{rest.format(s)}"
                                      for i, (a, s) in enumerate([("pre_ln", 0), ("pre_ln", 1), ("post_ln", 0),
                                                                  ("post_ln", 1)])]  # fmt: skip

    if mid is not None:  # the sweep was still going: the runs found so far, none dropped or misread
        md, was_running = mid
        runs = all_runs(md)
        assert 1 <= len(runs) <= 4 and set(runs) <= {j.name for j in jobs}
        assert all(r["status"] in ("completed", "running") for r in runs.values()), runs
        assert not was_running or len(runs) < 4 or any(r["status"] == "running" for r in runs.values())

    assert report.main([str(sweep)]) == 0
    md = (sweep / "report.md").read_text()
    rows = table(md, "group")
    assert list(rows) == sorted(rows, key=lambda g: float(rows[g]["best val loss"].split()[0]))
    assert set(rows) == {"arch=pre_ln", "arch=post_ln"}
    summaries = {j.name: json.loads((j / "summary.json").read_text()) for j in jobs}
    for arch in ("pre_ln", "post_ln"):
        mine = [s for s in summaries.values() if s["arch"] == arch]
        assert {s["status"] for s in mine} == {"completed"} and sorted(s["seed"] for s in mine) == [0, 1]
        row = rows[f"arch={arch}"]
        assert row["runs"] == "2" and row["status"] == "2 completed" and row["diverged"] == "0"
        assert row["best val loss"] == mean_std([s["best_val_loss"] for s in mine])
        assert row["final val loss"] == mean_std([s["final_val_loss"] for s in mine])
        assert row["tokens/s"] == f"{statistics.fmean(s['tokens_per_s'] for s in mine):,.0f}"
    runs = all_runs(md)
    assert set(runs) == set(summaries)
    for name, s in summaries.items():
        assert runs[name]["seed"] == str(s["seed"]) and runs[name]["step"] == "20" == str(s["step"])
        assert runs[name]["group"] == f"arch={s['arch']}" and runs[name]["status"] == "completed"
    for name in ("loss_curves.png", "var_resid_depth.png", "grad_norm_layer_depth.png", "maxabs_resid_depth.png"):
        check_png(sweep / name)
    assert len(re.findall(r'src="data:image/png;base64,', (sweep / "report.html").read_text())) == 4


def test_report_on_a_partly_failed_real_sweep(tmp_path):
    """Failed (start-up error) and diverged jobs never stop a sweep; the report shows them."""
    sweep = tmp_path / "sweep"
    run_cli(["train", "-m", "optim.lr=1e-3,50", "model.seq_len=32,300000", *REAL, "trainer.max_steps=10",
             f"hydra.sweep.dir={sweep}"], cwd=tmp_path, check=True)  # fmt: skip
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
    diverged = rows["optim.lr=50 model.seq_len=32"]
    assert diverged["status"] == "1 diverged" and diverged["diverged"] == "1" and diverged["best val loss"] == "—"
    for rate in ("0.001", "50"):
        failed = rows[f"optim.lr={rate} model.seq_len=300000"]
        assert failed["status"] == "1 failed" and "longer than the validation split" in failed["notes"]
    lr_rows = table(md.split("Largest stable learning rate")[1], "group")
    assert lr_rows["model.seq_len=32"]["largest stable lr"] == "0.001"
    assert lr_rows["model.seq_len=32"]["diverged at"] == "50"
    assert lr_rows["model.seq_len=300000"]["largest stable lr"] == "—"
    for name in ("loss_curves.png", "var_resid_depth.png", "lr_sweep.png"):
        check_png(sweep / name)


def test_bookkeeping_keys_are_the_ones_hydra_leaves_out_of_job_dir_names():
    from normbench.cli import config_dir
    from normbench.rundir import BOOKKEEPING_KEYS

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
