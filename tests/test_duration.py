"""The duration ladder (reproduce/ladders/duration.py): a branched rung is exactly a standalone WSD run, the rungs'
plans, bad options as one line, and (slow) a whole ladder writing duration.json and duration.png."""

from __future__ import annotations

import json

import pytest
import yaml

from normbench.claims.registry import load_claim
from normbench.reproduce.ladders.duration import seed_branches
from normbench.reproduce.request import Request
from normbench.run.metrics import read_jsonl

from conftest import run_cli

WSD = [
    "model=tiny",
    "sched=wsd",
    "sched.warmup_steps=2",
    "sched.decay_fraction=0.2",
    "trainer.batch_size=4",
    "trainer.log_every=1",
    "trainer.eval_every=4",
    "trainer.eval_batches=2",
    "diag.every=4",
    "seed=3",
]


@pytest.mark.slow
def test_a_branch_from_the_trunk_is_the_standalone_wsd_run(tmp_path):
    """Forked at its cooldown start (step 16 of 20), a branch of a 30-step trunk trains the very steps a
    20-step WSD run trains: same losses, LRs and val losses to the last bit (CPU is deterministic)."""
    alone, trunk, branch = tmp_path / "alone" / "job", tmp_path / "trunk" / "job", tmp_path / "branch" / "job"
    run_cli(["train", *WSD, "trainer.max_steps=20", f"hydra.run.dir={alone}"], tmp_path, check=True)
    run_cli(
        ["train", *WSD, "trainer.max_steps=30", "trainer.save_at=[16]", f"hydra.run.dir={trunk}"], tmp_path, check=True
    )
    assert (trunk / "checkpoints" / "step_16.pt").is_file()
    seed_branches(tmp_path / "trunk", tmp_path / "branch", 16, log=lambda *_: None)
    info = json.loads((branch / "branch.json").read_text())
    assert info["trunk"] == str(trunk) and info["step"] == 16
    resume = ["trainer.resume=true", "trainer.resume_allow_changed=[trainer.max_steps]"]
    run_cli(["train", *WSD, "trainer.max_steps=20", *resume, f"hydra.run.dir={branch}"], tmp_path, check=True)
    a, b = read_jsonl(alone / "metrics.jsonl"), read_jsonl(branch / "metrics.jsonl")
    keys = ("step", "loss", "lr", "val_loss", "grad_norm")
    assert [[r.get(k) for k in keys] for r in a] == [[r.get(k) for k in keys] for r in b]
    assert a[-1]["step"] == 20 and a[-1]["lr"] < a[10]["lr"]  # the cooldown ran
    s = json.loads((branch / "summary.json").read_text())
    assert s["status"] == "completed" and s["step"] == 20
    assert s["best_val_loss"] == json.loads((alone / "summary.json").read_text())["best_val_loss"]


def test_duration_dry_runs_plan_each_rung(tmp_path, capsys):
    from normbench.cli import main

    assert main(["reproduce", "peri_variance", "duration=ladder", f"out={tmp_path}", "--dry-run"]) == 0
    out = capsys.readouterr().out
    for ratio, steps in ((1, 224), (5, 1120), (20, 4480)):  # round(R * 229,376 / 1,024)
        assert f"duration rung {ratio} tokens per parameter" in out and f"trainer.max_steps={steps} " in out
    assert main(["reproduce", "peri_variance", "duration=branch", "rungs=1,5", f"out={tmp_path}", "--dry-run"]) == 0
    out = capsys.readouterr().out
    # the trunk: WSD at 5 tokens per parameter, kept at the 1-token rung's cooldown start (224 - 45)
    assert "sched=wsd" in out and "trainer.max_steps=1120" in out and "trainer.save_at=[179]" in out
    assert "sched.warmup_steps=22" in out  # 10% of the shortest rung, for trunk and branches alike


@pytest.mark.parametrize(
    "args, message",
    [
        (["duration=long"], "duration=long is not allowed; choose one of: ladder, branch, false"),
        (["rungs=1,5"], "rungs=1,5 must be tokens per parameter (e.g. rungs=1,5,20) with duration="),
        (["duration=ladder", "rungs=a"], "rungs=a must be tokens per parameter"),
        (["duration=ladder", "ladder=true"], "two ladders"),
        (["duration=ladder", "scale=quick"], "scale=quick declares no tokens_per_param"),
    ],
)
def test_bad_duration_options_are_one_line(args, message, capsys):
    from normbench.cli import main

    assert main(["reproduce", "peri_variance", *args, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.slow
def test_duration_ladder_end_to_end(tmp_path):
    from normbench.reproduce.ladders.duration import run_duration

    raw = {
        "claim": "made up",
        "paper": "nobody",
        "scales": {
            "cpu": {
                "seeds": 2,
                "tokens_per_param": 0.1,
                "duration": [0.05, 0.1],
                "fixed": [
                    "model=tiny",
                    "trainer.batch_size=4",
                    "trainer.eval_every=10",
                    "trainer.eval_batches=2",
                    "diag.every=10",
                ],
                "sweeps": [{"norm": ["layernorm", "rmsnorm"]}],
            }
        },
        "tests": [
            {
                "name": "parity",
                "kind": "on_par",
                "metric": "best_val_loss",
                "group": {"norm": "rmsnorm"},
                "baseline": {"norm": "layernorm"},
                "band": [-0.5, 0.5],
            }
        ],
    }
    (tmp_path / "madeup.yaml").write_text(yaml.safe_dump(raw))
    claim, out = load_claim("madeup", tmp_path), tmp_path / "out"
    res = run_duration(claim, Request(out=out, min_seeds=2, duration="branch"), log=lambda *_: None)
    assert [r["tokens_per_param"] for r in res["rungs"]] == [0.05, 0.1]
    saved = json.loads((out / "madeup" / "duration_branch.json").read_text())
    assert saved["mode"] == "branch" and saved["rungs"][0]["steps"] == 24 and saved["rungs"][1]["steps"] == 48
    assert (out / "madeup" / "duration_branch.png").stat().st_size > 1000
    branches = list((out / "madeup" / "duration" / "branch" / "tpp0.05").rglob("branch.json"))
    assert len(branches) == 4  # 2 norms x 2 seeds, each from its trunk run
    res = run_duration(claim, Request(out=out, min_seeds=2, duration="ladder"), log=lambda *_: None)
    assert (out / "madeup" / "duration.json").is_file() and (out / "madeup" / "duration.png").is_file()
    assert [r["verdict"] for r in res["rungs"]] and all(r["tests"][0]["effect"] is not None for r in res["rungs"])


def test_claims_table_rows_from_written_files(tmp_path, capsys):
    import importlib.util

    from conftest import REPO

    spec = importlib.util.spec_from_file_location("claims_table", REPO / "scripts" / "claims_table.py")
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    test = {
        "name": "var",
        "verdict": "HOLDS",
        "effect": -1.05,
        "ci": [-1.2, -0.9],
        "interval": "paired",
        "ratio": 0.35,
        "groups": {
            "arch=peri_ln": {"mean": 3.2, "values": [3.0, 3.2, 3.4], "outcomes": {"learned": 3}},
            "arch=pre_ln": {"mean": 9.4, "values": [9.0, 9.4, 9.8], "outcomes": {"learned": 3}},
        },
    }
    verdict = {
        "claim": "peri_variance",
        "verdict": "HOLDS",
        "tests": [test],
        "length": {"steps": 4480},
        "run_time_s": 1800.4,
    }
    (tmp_path / "a.json").write_text(json.dumps(verdict))
    other = json.loads(json.dumps(verdict))
    other["tests"][0]["groups"]["arch=pre_ln"]["values"] = [9.5, 9.4, 9.3]
    (tmp_path / "b.json").write_text(json.dumps(other))
    rung = {"tokens_per_param": 20.0, "steps": 4480, "verdict": "HOLDS", "tests": [test], "run_time_s": 10}
    (tmp_path / "d.json").write_text(
        json.dumps({"claim": "peri_variance", "mode": "ladder", "rungs": [rung], "run_time_s": 10})
    )
    assert table.main(["verdict", str(tmp_path / "a.json")]) == 0
    row = capsys.readouterr().out
    assert row.startswith("| `peri_variance` | **HOLDS** | var: **HOLDS** -1.05 (×0.35) [-1.2, -0.9] (paired)")
    assert "| 4480 | 1800 |" in row
    assert table.main(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    assert "arch=pre_ln: 0.5, 0, -0.5 (mean 0)" in capsys.readouterr().out
    assert table.main(["duration", str(tmp_path / "d.json")]) == 0
    rows = capsys.readouterr().out
    assert rows.startswith("#### peri_variance (ladder, 10 s of runs)\n\n| tokens per parameter |")
    assert "| 20 | 4480 | **HOLDS** |" in rows
    assert table.main([]) == 2


def test_a_ladder_composes_each_job_once_for_all_its_rungs(tmp_path, capsys, monkeypatch):
    """duration=ladder and ladder=true build every rung's plan from one composition of the claim's jobs
    (reproduce/plan.py: Plan.derived); the ladder adds one composition of the fixed settings (its sizes)."""
    from normbench.cli import main
    from normbench.reproduce import shared

    calls = []
    real = shared.compose
    monkeypatch.setattr(shared, "compose", lambda *a: calls.append(a[2]) or real(*a))
    assert main(["reproduce", "peri_variance", "duration=ladder", f"out={tmp_path}", "--dry-run"]) == 0
    assert capsys.readouterr().out.count("normbench train -m") == 3 and len(calls) == 2  # 3 rungs, 2 jobs
    calls.clear()
    assert main(["reproduce", "rmsnorm_parity", "ladder=true", f"out={tmp_path}", "--dry-run"]) == 0
    assert capsys.readouterr().out.count("normbench train -m") == 3 and len(calls) == 2 + 1


def test_a_derived_plan_is_the_plan_composed_with_its_overrides(tmp_path):
    """A rung's plan from the claim's jobs (the keys set in copies of the composed configs) equals the plan
    composed afresh with the rung's overrides, key for key; a config group in them composes again."""
    from normbench.reproduce import plan as plans
    from normbench.reproduce.ladders.scale import mup_overrides
    from normbench.run.resume import flat_config

    claim = load_claim("rmsnorm_parity")
    base = plans.start(claim, "cpu", None, ["hydra/launcher=basic"], tmp_path)
    for rung in (["model.d_model=128", *mup_overrides(128, 64, 16)], ["trainer.max_steps=224", "sched=wsd"]):
        derived = base.derived(rung)
        fresh = plans.start(claim, "cpu", None, ["hydra/launcher=basic", *rung], tmp_path)
        assert [(j.sweep, j.values, flat_config(j.cfg)) for j in derived.jobs] == [
            (j.sweep, j.values, flat_config(j.cfg)) for j in fresh.jobs
        ]
        assert derived.overrides == fresh.overrides and derived.argvs == fresh.argvs
    assert {flat_config(j.cfg)["model.d_model"] for j in base.jobs} == {64}  # the base is untouched
