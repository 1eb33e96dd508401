"""The LR ladder (reproduce/ladders/lr.py): its rungs, its dry run, its refusals as one line, the files it writes
(with the verdicts faked, fast) and (slow) a whole ladder of a made-up two-norm claim."""

from __future__ import annotations

import json

import pytest
import yaml

from normbench.claims.registry import load_claim
from normbench.cli import main
from normbench.reproduce.ladders import lr as lr_ladder
from normbench.reproduce.request import Request


def _made_up(tmp_path, seeds=2):
    raw = {
        "claim": "made up",
        "paper": "nobody",
        "scales": {
            "cpu": {
                "seeds": seeds,
                "fixed": [
                    "model=tiny",
                    "optim.lr=auto",
                    "trainer.max_steps=12",
                    "trainer.batch_size=4",
                    "trainer.eval_every=6",
                    "trainer.eval_batches=2",
                    "diag.every=6",
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
    return load_claim("madeup", tmp_path)


def test_the_rungs_are_a_third_one_and_three_times_the_claims_lr():
    assert lr_ladder.rung_lrs(7.2e-3) == [(1 / 3, 2.4e-3), (1.0, 7.2e-3), (3.0, 2.16e-2)]
    assert lr_ladder.rung_lrs(1e-3) == [(1 / 3, 3.333e-4), (1.0, 1e-3), (3.0, 3e-3)]


def test_the_dry_run_prints_the_rungs_and_reuses_the_verdicts_sweep_at_1x(tmp_path, capsys):
    assert main(["reproduce", "peri_variance", "scale=quick", "lr=ladder", f"out={tmp_path}", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "LR ladder at 0.0024 (1/3x), 0.0072 (1x), 0.0216 (3x) of the claim's 0.0072 (optim.lr=auto" in out
    for lr in ("0.0024", "0.0216"):
        assert f"LR rung {lr}" in out and f"optim.lr={lr} arch=pre_ln,peri_ln" in out
        assert f"hydra.sweep.dir={tmp_path}/peri_variance/lr_ladder/lr{lr}/peri_variance/runs/quick-" in out
    assert f"hydra.sweep.dir={tmp_path}/peri_variance/runs/quick-" in out  # 1x: where the verdict's sweep runs


@pytest.mark.parametrize(
    "args, message",
    [
        (["qknorm_lr", "lr=ladder"], "claim qknorm_lr sweeps optim.lr (its verdict is read off an LR grid)"),
        (["ngpt_speed", "lr=ladder"], "claim ngpt_speed judges each side at its own best optim.lr (tune: optim.lr)"),
        (["peri_variance", "lr=3e-3"], "lr=3e-3 is not allowed; choose one of: ladder, false"),
        (["peri_variance", "lr=ladder", "duration=ladder"], "duration= and lr= are two ladders"),
    ],
)
def test_bad_lr_ladders_are_one_line(args, message, capsys):
    assert main(["reproduce", *args, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_the_ladder_writes_each_rungs_lr_and_verdict(tmp_path, monkeypatch):
    """The verdicts faked (reproduce is the runner's, tested elsewhere): each rung's call, its place and its
    entry in lr_ladder.json, and the figure."""
    from normbench.reproduce import runner

    calls = []

    def fake(claim, req, **kw):
        calls.append((list(req.overrides), req.out))
        effect = {0: 0.1, 1: 0.2, 2: 0.7}[len(calls) - 1]
        verdict = "HOLDS" if effect < 0.5 else "DOES NOT HOLD"
        test = {
            "name": "parity",
            "kind": "on_par",
            "verdict": verdict,
            "effect": effect,
            "ci": [effect - 0.1, effect + 0.1],
            "threshold": [-0.5, 0.5],
            "interval": "paired",
        }
        return {"verdict": test["verdict"], "tests": [test], "run_time_s": 2.0, "length": {"steps": 12}}

    monkeypatch.setattr(runner, "reproduce", fake)
    out = tmp_path / "out"
    res = lr_ladder.run_lr_ladder(_made_up(tmp_path), Request(out=out, min_seeds=2), log=lambda *_: None)
    assert calls == [
        (["optim.lr=0.0024"], out / "madeup" / "lr_ladder" / "lr0.0024"),
        ([], out),
        (["optim.lr=0.0216"], out / "madeup" / "lr_ladder" / "lr0.0216"),
    ]
    saved = json.loads((out / "madeup" / "lr_ladder.json").read_text())
    assert saved == json.loads(json.dumps(res, default=str))
    assert saved["lr"] == 7.2e-3 and saved["lr_source"] == "optim.lr=auto (0.0006 x 768/64)"
    assert [(r["lr"], r["factor"], r["verdict"]) for r in saved["rungs"]] == [
        (2.4e-3, 0.3333, "HOLDS"),
        (7.2e-3, 1.0, "HOLDS"),
        (2.16e-2, 3.0, "DOES NOT HOLD"),
    ]
    assert saved["run_time_s"] == 6.0 and (out / "madeup" / "lr_ladder.png").stat().st_size > 1000


@pytest.mark.slow
def test_lr_ladder_end_to_end(tmp_path):
    claim, out = _made_up(tmp_path), tmp_path / "out"
    res = lr_ladder.run_lr_ladder(claim, Request(out=out, min_seeds=2), log=lambda *_: None)
    assert [r["lr"] for r in res["rungs"]] == [2.4e-3, 7.2e-3, 2.16e-2]
    assert all(r["tests"][0]["effect"] is not None and r["steps"] == 12 for r in res["rungs"])
    summary = next((out / "madeup" / "lr_ladder" / "lr0.0216").rglob("summary.json"))
    assert json.loads(summary.read_text())["lr"] == 2.16e-2  # the rung's runs trained at the rung's LR
    assert (out / "madeup" / "runs").is_dir()  # the 1x rung is the claim's own sweep
    assert (out / "madeup" / "lr_ladder.png").stat().st_size > 1000


def test_claims_table_writes_an_lr_ladders_rows(tmp_path, capsys):
    import importlib.util

    from conftest import REPO

    spec = importlib.util.spec_from_file_location("claims_table", REPO / "scripts" / "claims_table.py")
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    test = {"name": "var", "verdict": "HOLDS", "effect": -0.5, "ci": [-0.7, -0.3]}
    rungs = [
        {"lr": lr, "factor": f, "steps": 200, "verdict": "HOLDS", "tests": [test], "run_time_s": 5}
        for lr, f in ((2.4e-3, 0.3333), (7.2e-3, 1.0))
    ]
    ladder = {"claim": "peri_variance", "lr": 7.2e-3, "lr_source": "optim.lr=auto", "rungs": rungs, "run_time_s": 10}
    (tmp_path / "l.json").write_text(json.dumps(ladder))
    assert table.main(["lr", str(tmp_path / "l.json")]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[0] == "#### peri_variance (LR ladder around 0.0072, optim.lr=auto; 10 s of runs)"
    assert rows[4] == "| 0.0024 (0.333×) | 200 | **HOLDS** | var: HOLDS -0.5 [-0.7, -0.3] | 5 |"
