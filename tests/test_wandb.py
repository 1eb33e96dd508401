"""W&B logging, offline only (``WANDB_MODE=offline``; no API key, no network).

What W&B logged is read back from each run's own transaction log
(``run_dir/wandb/offline-run-*/run-<id>.wandb``, the file ``wandb sync`` uploads).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import yaml

from normbench import report
from normbench.diag.wandb_logger import WandbLogger, sweep_group

from conftest import REPO, TINY, compose, run_cli


# ----------------------------------------------------------------------------- reading an offline run
def wandb_records(path: Path):
    """Records of a ``.wandb`` file: a LevelDB-style log (32 KiB blocks, 7-byte chunk headers
    crc32c/length/type) after a 7-byte ``:W&B`` header; each record is a protobuf ``Record``."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block, head = path.read_bytes(), 32768, 7
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    pos, buf = head, b""
    while pos + head <= len(data):
        if block - pos % block < head:  # block trailer
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + head])
        if kind == 0 and length == 0:  # zero padding: end of the written part
            break
        chunk, pos = data[pos + head : pos + head + length], pos + head + length
        buf = chunk if kind in (1, 2) else buf + chunk  # 1 full, 2 first, 3 middle, 4 last
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(buf)
            yield record


def _key(item) -> str:
    return "/".join(item.nested_key) or item.key


def read_offline_run(run_dir: Path) -> dict:
    """What one offline W&B run holds: run settings, config, history rows, summary, exit code."""
    out = {"history": [], "summary": {}, "config": {}, "exit_code": None, "run": None, "config_updates": {}}
    (path,) = run_dir.glob("run-*.wandb")  # a 2nd dir of the same run in the same second is named "...-<id>-1"
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            out["run"] = record.run
            out["config"].update({_key(i): json.loads(i.value_json) for i in record.run.config.update})
        elif kind == "config":  # later updates, e.g. custom charts under ("_wandb", "visualize", key)
            out["config_updates"].update(
                {tuple(i.nested_key) or (i.key,): json.loads(i.value_json) for i in record.config.update}
            )
        elif kind == "history":
            out["history"].append({_key(i): json.loads(i.value_json) for i in record.history.item})
        elif kind == "summary":
            out["summary"].update({_key(i): json.loads(i.value_json) for i in record.summary.update})
        elif kind == "exit":
            out["exit_code"] = record.exit.exit_code
    return out


def offline_runs(job_dir: Path) -> list[Path]:
    return sorted((job_dir / "wandb").glob("offline-run-*"))


# ----------------------------------------------------------------------------- tests
@pytest.mark.slow
def test_offline_sweep_logs_one_run_per_job(tmp_path):
    sweep = tmp_path / "sweep"
    args = [
        "train",
        "-m",
        "arch=pre_ln,post_ln",
        "logger=wandb",
        *TINY,
        "trainer.max_steps=6",
        "diag.every=2",
        "trainer.log_every=2",
        "trainer.eval_every=3",
        f"hydra.sweep.dir={sweep}",
    ]
    proc = run_cli(args, cwd=tmp_path, env={"WANDB_MODE": "offline", "WANDB_SILENT": "false"}, check=True)
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert [j.name.split("_", 1)[0] for j in jobs] == ["0", "1"]
    # the console keeps to normbench's lines; W&B's banner and tables go to each run's train.log
    assert "wandb:" not in proc.stdout + proc.stderr
    assert all("wandb: Run summary:" in (job / "train.log").read_text() for job in jobs)

    runs = []
    for job, arch in zip(jobs, ("pre_ln", "post_ln")):
        (run_dir,) = offline_runs(job)  # exactly one W&B run per job
        run = read_offline_run(run_dir)
        runs.append(run)
        settings = run["run"]
        assert settings.project == "normbench" and settings.job_type == "train"
        assert list(settings.tags) == [arch, "rmsnorm", "adamw", "stuck"]  # the outcome, added at finish()
        assert settings.display_name.split() == [
            o for o in (job / ".hydra" / "overrides.yaml").read_text().replace("- ", "").split() if o != "logger=wandb"
        ]
        # the full resolved config, plus where the job sits in its sweep
        assert run["config"]["arch"]["name"] == arch and run["config"]["model"]["n_layer"] == 2
        assert run["config"]["trainer"]["max_steps"] == 6 and run["config"]["logger"]["name"] == "wandb"
        assert run["config"]["hydra"]["override_dirname"] == job.name.split("_", 1)[1]

        # every metrics.jsonl record is a W&B history row at the same step, lists as sections
        metrics = report.read_metrics(job / "metrics.jsonl")
        rows = {r["_step"]: r for r in run["history"]}
        assert sorted(rows) == [m["step"] for m in metrics]
        for m in metrics:
            row = rows[m["step"]]
            assert row["loss"] == pytest.approx(m["loss"]) and row["step"] == m["step"]
            for key, value in m.items():
                if isinstance(value, list):
                    assert [row[f"{key}/layer_{i:02d}"] for i in range(len(value))] == pytest.approx(value)
        diag = [m for m in metrics if "var_resid" in m]
        assert diag and len(diag[0]["var_resid"]) == 3 and len(diag[0]["grad_norm_layer"]) == 2
        assert "val_loss" in rows[metrics[-1]["step"]]
        # metric-vs-depth line charts: a table per metric, logged at diag records
        charts = [r for r in run["history"] if "depth/var_resid_table/path" in r]
        assert charts and all("depth/grad_norm_layer_table/path" in r for r in charts)
        chart = run["config_updates"][("_wandb", "visualize", "depth/maxabs_resid")]
        assert chart["panel_config"]["panelDefId"] == "wandb/lineseries/v0"
        # the job's status and results in the run summary; finished with exit code 0
        summary = json.loads((job / "summary.json").read_text())
        assert run["summary"]["status"] == summary["status"] == "completed"
        assert run["summary"]["best_val_loss"] == pytest.approx(summary["best_val_loss"])
        assert run["summary"]["outcome"] == summary["outcome"] == "stuck"  # 6 steps never beat the unigram entropy
        assert run["summary"]["baseline_loss"] == pytest.approx(summary["baseline_loss"])
        assert run["summary"]["var_growth"] == pytest.approx(summary["var_growth"])
        # per-layer statistics as scalars at every diag step (outcomes.step_stats)
        for m in diag:
            assert rows[m["step"]]["layer_stats/var_growth"] == pytest.approx(m["var_resid"][-1] / m["var_resid"][1])
        assert run["exit_code"] == 0

    # two jobs: two runs, one group (the sweep)
    assert runs[0]["run"].run_id != runs[1]["run"].run_id
    assert runs[0]["run"].run_group == runs[1]["run"].run_group == sweep_group(sweep) == f"{tmp_path.name}/sweep"


@pytest.fixture
def wandb_cfg(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.chdir(tmp_path)

    def make(*overrides):
        return compose([*TINY, "logger=wandb", "trainer.max_steps=4", "diag.every=2", *overrides])

    return make


def test_crashed_run_finishes_with_nonzero_exit_code(tmp_path, wandb_cfg, monkeypatch):
    from normbench.train import trainer

    def boom(self):
        self.recorder.wandb.log({"step": 1, "loss": 5.0})
        raise RuntimeError("simulated crash")

    monkeypatch.setattr(trainer.Trainer, "fit", boom)
    with pytest.raises(RuntimeError, match="simulated crash"):
        trainer.run(wandb_cfg(), tmp_path / "run")
    (run_dir,) = offline_runs(tmp_path / "run")
    run = read_offline_run(run_dir)
    assert run["exit_code"] != 0
    assert run["summary"]["status"] == "failed" and "simulated crash" in run["summary"]["reason"]
    assert run["run"].run_group == ""  # a single run has no group


def test_resumed_run_continues_the_same_wandb_run(tmp_path, wandb_cfg):
    from normbench.train import checkpoint, trainer

    run_dir = tmp_path / "run"
    first = trainer.run(wandb_cfg(), run_dir)
    assert first["status"] == "completed"
    (offline,) = offline_runs(run_dir)
    run_id = read_offline_run(offline)["run"].run_id
    assert checkpoint.load(run_dir / "checkpoints" / "last.pt")["wandb_id"] == run_id

    trainer.run(wandb_cfg("trainer.resume=true"), run_dir)
    runs = offline_runs(run_dir)
    assert len(runs) == 2  # offline: a second run directory for the same run (`wandb sync` both)
    assert {read_offline_run(r)["run"].run_id for r in runs} == {run_id}
    assert checkpoint.load(run_dir / "checkpoints" / "last.pt")["wandb_id"] == run_id


def test_disabled_is_a_noop(tmp_path, monkeypatch):
    lg = WandbLogger(compose([*TINY]), tmp_path)  # logger=jsonl
    assert lg.run is None and lg.run_id is None
    lg.log({"step": 1, "loss": 1.0, "var_resid": [1.0, 2.0]})
    lg.finish(1)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    lg = WandbLogger(compose([*TINY, "logger=wandb"]), tmp_path)
    assert lg.run is None
    lg.log({"step": 1, "loss": 1.0})
    lg.finish()
    assert not (tmp_path / "wandb").exists()


class FakeRun:
    def __init__(self):
        self.logged, self.summary, self.tags, self.exit_code = [], {}, ("pre_ln",), None

    def log(self, data, step):
        self.logged.append((step, data))

    def finish(self, exit_code=0):
        self.exit_code = exit_code


def test_depth_charts_are_few_and_cover_first_and_last(tmp_path):
    lg = WandbLogger(compose([*TINY]), tmp_path)
    lg.run = run = FakeRun()
    for step in range(0, 200, 10):  # 20 diag records
        lg.log({"step": step, "loss": 1.0, "var_resid": [1.0, 2.0, float(step)], "grad_norm_layer": [0.1, 0.2]})
    lg.log({"step": 200, "loss": 1.0})  # the last record has no diagnostics
    (tmp_path / "summary.json").write_text(json.dumps({"status": "diverged", "reason": "nan", "best_val_loss": 2.0}))
    lg.finish(0)
    charted = [step for step, data in run.logged if "depth/var_resid" in data]
    assert charted == [0, 10, 30, 70, 150, 200]  # diag records 1, 2, 4, 8, 16; at finish(), the last step
    table = run.logged[-1][1]["depth/var_resid"].table
    lines = {}
    for x, key, y in table.data:
        lines.setdefault(key, []).append((x, y))
    assert list(lines)[0] == "step 0" and list(lines)[-1] == "step 190" and len(lines) <= 6
    assert lines["step 190"] == [(0, 1.0), (1, 2.0), (2, 190.0)]
    assert run.summary == {"status": "diverged", "reason": "nan", "best_val_loss": 2.0}
    assert "diverged" in run.tags and run.exit_code == 0


def test_resumed_logger_refills_depth_profiles_and_spike_steps_are_no_layers(tmp_path):
    from normbench.diag.wandb_logger import flatten_record
    from normbench.run.metrics import JsonlWriter

    writer = JsonlWriter(tmp_path / "metrics.jsonl")
    for step in (1, 10, 20):  # written by the first process
        writer.write({"step": step, "loss": 1.0, "var_resid": [1.0, float(step)]})
    writer.close()
    lg = WandbLogger(compose([*TINY]), tmp_path)
    lg.run = run = FakeRun()
    lg._restore_profiles()  # what __init__ does for a resumed W&B run
    assert sorted(lg._profiles["var_resid"]) == [1, 10, 20] and lg._n_diag == lg._charted == 3
    lg.log({"step": 30, "loss": 1.0, "var_resid": [1.0, 30.0]})  # diag record 4: charts, from step 1 on
    table = run.logged[-1][1]["depth/var_resid"].table
    assert {key for _, key, _ in table.data} >= {"step 1", "step 30"}

    flat = flatten_record({"step": 5, "spikes": 2, "spike_steps": [3, 4], "grad_norm_layer": [0.5, 0.25]})
    assert flat == {"step": 5, "spikes": 2, "grad_norm_layer/layer_00": 0.5, "grad_norm_layer/layer_01": 0.25}


def test_workspace_spec_for_a_sweep(tmp_path, monkeypatch):
    """scripts/wandb_workspace.py builds the panels of `normbench report` for a sweep group; the
    test stops before saving (the only network step) and forbids network access."""
    import socket

    def no_network(*args, **kwargs):
        raise AssertionError("network access")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    import wandb_workspace

    sweep = tmp_path / "multirun" / "2026-01-01" / "12-00-00-000001"
    for job, (arch, lr) in enumerate([("pre_ln", 1e-3), ("post_ln", 1e-3), ("pre_ln", 1e-2), ("post_ln", 1e-2)]):
        run = sweep / f"{job}_arch={arch},optim.lr={lr}"
        (run / ".hydra").mkdir(parents=True)
        config = {
            "arch": {"name": arch},
            "optim": {"name": "adamw", "lr": lr},
            "model": {"n_layer": 3},
            "seed": 0,
            "logger": {"name": "wandb", "wandb": {"project": "myproj", "entity": None}},
        }
        (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
        (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"arch={arch}", f"optim.lr={lr}", "seed=0"]))
        (run / "summary.json").write_text(json.dumps({"status": "completed", "best_val_loss": 2.0}))

    info = wandb_workspace.sweep_info(sweep)
    assert info == {
        "group": "2026-01-01/12-00-00-000001",
        "varying": ["arch", "optim.lr"],
        "n_layer": 3,
        "lr_sweep": True,
        "project": "myproj",
        "entity": None,
    }
    assert info["group"] == sweep_group(sweep)  # the group the jobs logged into

    out = tmp_path / "spec.json"
    assert wandb_workspace.main([str(sweep), "--dry-run", "--out", str(out)]) == 0
    saved = json.loads(out.read_text())
    spec = saved["spec"]
    assert saved["project"] == "myproj" and saved["name"] == "normbench 2026-01-01/12-00-00-000001"
    assert spec["filter"] == {"group": info["group"]} and spec["groupby"] == ["arch.name", "optim.lr"]
    sections = {s["name"]: s["panels"] for s in spec["sections"]}
    assert list(sections) == [
        "loss curves",
        "val loss",
        "depth profiles",
        "var_resid",
        "grad_norm_layer",
        "maxabs_resid",
    ]
    assert [p["y"] for p in sections["loss curves"]][:2] == ["loss", "val_loss"]
    assert {p["kind"] for p in sections["val loss"]} == {"bar", "scatter"}  # the lr sweep adds val loss vs lr
    # per-layer sections: the keys WandbLogger logs (n_layer + 1 residual-stream entries, n_layer blocks)
    assert [p["y"] for p in sections["var_resid"]] == [f"var_resid/layer_{i:02d}" for i in range(4)]
    assert [p["y"] for p in sections["grad_norm_layer"]] == [f"grad_norm_layer/layer_{i:02d}" for i in range(3)]
    assert len(sections["maxabs_resid"]) == 4
    assert [p["table"] for p in sections["depth profiles"]] == [
        "depth/var_resid_table",
        "depth/grad_norm_layer_table",
        "depth/maxabs_resid_table",
    ]

    # the wandb-workspaces objects: a workspace (its saved form builds offline) and a report
    pytest.importorskip("wandb_workspaces", reason="pip install wandb-workspaces (the sweeps extra)")
    workspace = wandb_workspace.build_workspace(spec, "me", "myproj", "sweep view")
    model = json.dumps(workspace._to_model().model_dump(by_alias=True, exclude_none=True), default=str)
    assert '"name": "group"' in model and '"value": "2026-01-01/12-00-00-000001"' in model
    assert '"name": "arch.value.name"' in model  # grouped by the nested config key
    assert [s.name for s in workspace.sections] == list(sections)
    assert sum(len(s.panels) for s in workspace.sections) == sum(len(p) for p in sections.values())
    rep = wandb_workspace.build_report(spec, "me", "myproj", "sweep report")
    assert len(rep.blocks) == 1 + 2 * len(sections)
