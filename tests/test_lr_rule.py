"""``optim.lr: auto``: GPT-2 124M's AdamW LR (6e-4 at d 768) carried to the width by the 1/fan_in rule
(config/lr_rule.py, docs/init.md), its refusals, the start-up line, summary.json and the claims' dry run."""

from __future__ import annotations

import json

import pytest
import torch

from normbench.claims.registry import load_claim
from normbench.cli import main
from normbench.config import lr_rule
from normbench.errors import ConfigError
from normbench.model import build_model
from normbench.optim import optimizers as optim
from normbench.reproduce.shared import check_claim
from normbench.run.resume import config_diff, flat_config
from normbench.validation import validate

from conftest import compose, run_cli


def test_the_carried_lr_is_exact_at_each_width():
    # 6e-4 x 768 / d: 0.46080 / 64 = 0.0072, / 128 = 0.0036, / 768 = 0.0006, as the very floats of the literals
    assert lr_rule.carried(6e-4, 768, 64) == 7.2e-3
    assert lr_rule.carried(6e-4, 768, 128) == 3.6e-3
    assert lr_rule.carried(6e-4, 768, 768) == 6e-4
    assert lr_rule.carried(6e-4, 768, 192) == 2.4e-3
    assert lr_rule.carried(6e-4, 768, 96) == 4.8e-3
    assert lr_rule.resolve(compose(["model=tiny", "optim.lr=auto"]).optim, compose(["model=tiny"]).model) == 7.2e-3


def test_auto_resolves_at_the_models_width_and_from_the_config_reference():
    cfg = compose(["model=tiny", "model.d_model=128", "model.n_head=8", "optim.lr=auto"])
    assert lr_rule.resolve(cfg.optim, cfg.model) == 3.6e-3
    cfg = compose(["model=tiny", "optim.lr=auto", "optim.lr_ref=1e-3", "optim.lr_ref_width=512"])
    assert lr_rule.resolve(cfg.optim, cfg.model) == 8e-3  # 1e-3 x 512 / 64
    cfg = compose(["model=tiny", "optim.lr=0.002"])
    assert lr_rule.resolve(cfg.optim, cfg.model) == 2e-3 and lr_rule.source(cfg.optim, cfg.model) == "optim.lr=0.002"


def test_every_group_of_an_sp_model_trains_at_the_carried_lr():
    cfg = compose(["model=tiny", "optim.lr=auto"])
    opt = optim.build_optimizer(build_model(cfg, 256), cfg, log=lambda _: None)
    assert {g["lr"] for g in opt.param_groups} == {7.2e-3}
    assert set(opt.kind_lrs) >= {"matrix", "embed", "norm_in"} and set(opt.kind_lrs.values()) == {7.2e-3}


def test_under_mup_the_scalar_is_d_bases_and_the_matrices_get_the_same_rule():
    """d 128 from d_base 64: hidden matrices 7.2e-3 / 2 = 3.6e-3 (what SP's auto gives at d 128), the embedding
    and the vectors keep d_base's 7.2e-3 (muP: their LR does not scale with width). GELU's d_ff is exactly 4d
    (SwiGLU's rounded d_ff gives its c_proj its own fan-in ratio, 352/192 at d 128)."""
    cfg = compose(
        ["model=tiny", "model.d_model=128", "model.n_head=8", "model.mlp=gelu", "model.param=mup", "optim.lr=auto"]
    )
    torch.manual_seed(0)
    opt = optim.build_optimizer(build_model(cfg, 256), cfg, log=lambda _: None)
    assert opt.kind_lrs["matrix"] == pytest.approx(3.6e-3) and opt.kind_lrs["embed"] == 7.2e-3
    assert opt.kind_lrs["norm_in"] == 7.2e-3 and lr_rule.matrix_lr(cfg) == 3.6e-3


@pytest.mark.parametrize("name", ["lion", "muon", "sgd", "adafactor"])
def test_auto_is_refused_in_one_line_where_no_rule_carries_adamws_lr(name):
    with pytest.raises(ConfigError) as exc:
        validate(compose(["model=tiny", f"optim={name}", "optim.lr=auto"]))
    text = str(exc.value)
    assert "\n" not in text and "optim.lr=auto" in text and f"optim={name}" in text and "set optim.lr" in text


def test_a_word_other_than_auto_is_refused():
    with pytest.raises(ConfigError, match=r"optim.lr=fast is not allowed; choose auto or a number >= 0"):
        validate(compose(["model=tiny", "optim.lr=fast"]))


def test_a_run_at_the_number_resumes_under_auto():
    at_number = flat_config(compose(["model=tiny", "optim.lr=0.0072"]))
    at_auto = flat_config(compose(["model=tiny", "optim.lr=auto"]))
    assert config_diff(at_number, at_auto) == []
    assert config_diff(flat_config(compose(["model=tiny", "optim.lr=0.001"])), at_auto)  # a different LR is a change


def test_a_run_prints_and_records_its_resolved_lrs(tmp_path):
    run = tmp_path / "r"
    args = [
        "train",
        "model=tiny",
        "optim.lr=auto",
        "trainer.max_steps=3",
        "trainer.batch_size=4",
        "diag=off",
        "trainer.eval_every=1000",
        f"hydra.run.dir={run}",
    ]
    r = run_cli(args, tmp_path, check=True)
    line = "lr: embed 0.0072, matrix 0.0072, norm_in 0.0072 (optim.lr=auto (0.0006 x 768/64); peak, before the"
    assert line in r.stdout + r.stderr
    s = json.loads((run / "summary.json").read_text())
    assert s["lr"] == 7.2e-3 and s["lr_source"] == "optim.lr=auto (0.0006 x 768/64)"
    assert s["lr_resolved"]["matrix"] == s["lr_resolved"]["embed"] == 7.2e-3
    lr_part = {k: s["spec"][k] for k in ("lr", "lr_source", "matrix_lr")}
    assert lr_part == {"lr": 7.2e-3, "lr_source": "optim.lr=auto (0.0006 x 768/64)", "matrix_lr": 7.2e-3}
    assert s["spec"]["precision"] == "fp32" and s["spec"]["compile"] is False  # the other resolved values beside it


def test_the_claim_dry_run_shows_the_carried_hidden_matrix_lr(tmp_path, capsys):
    assert main(["reproduce", "peri_variance", f"out={tmp_path}", "scale=quick", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "peri_variance: hidden-matrix lr 0.0072 on every run (optim.lr=auto (0.0006 x 768/64))" in out


def test_the_shared_keys_check_passes_auto_on_both_sides_and_refuses_a_mismatch(tmp_path):
    import yaml

    def claim(sweeps):
        test = {
            "name": "loss",
            "kind": "difference",
            "metric": "best_val_loss",
            "group": {"norm": "rmsnorm"},
            "baseline": {"norm": "layernorm"},
            "threshold": 0.05,
        }
        scale = {"seeds": 1, "fixed": ["model=tiny", "trainer.max_steps=10"], "sweeps": sweeps}
        raw = {"claim": "made up", "paper": "nobody", "scales": {"cpu": scale}, "tests": [test]}
        (tmp_path / "madeup.yaml").write_text(yaml.safe_dump(raw))
        return load_claim("madeup", tmp_path)

    assert check_claim(claim([{"norm": ["layernorm", "rmsnorm"], "optim.lr": ["auto"]}]), "cpu")
    mismatch = [{"norm": ["layernorm"], "optim.lr": ["auto"]}, {"norm": ["rmsnorm"], "optim.lr": [1e-3]}]
    with pytest.raises(ConfigError, match=r"differ in optim.lr \(0.001 for .* vs auto for"):
        check_claim(claim(mismatch), "cpu")


def test_every_shipped_claim_says_its_lr_and_why_and_the_unswept_ones_train_at_auto():
    from normbench.claims.registry import claim_ids

    for cid in claim_ids():
        claim = load_claim(cid)
        assert len(claim.lr) > 40, f"{cid}: no lr statement"
        swept = any("optim.lr" in grid for grid in claim.grids("quick"))
        uses_muon = "optim=muon" in claim.settings("quick")
        if not swept and not uses_muon:
            assert "optim.lr=auto" in claim.settings("quick"), cid
            assert "optim.lr=auto" in claim.settings("cpu"), cid


def test_the_report_setup_box_shows_the_peak_lr():
    from types import SimpleNamespace

    from normbench.report.setup import LINES

    row = dict(LINES)["peak LR"]
    sp = SimpleNamespace(summary={"lr_resolved": {"embed": 7.2e-3, "matrix": 7.2e-3}, "lr_source": "optim.lr=auto (x)"})
    assert row(sp) == "0.0072 (optim.lr=auto (x))"
    mup = SimpleNamespace(summary={"lr_resolved": {"embed": 6e-4, "matrix": [6.4e-3, 7.2e-3]}})
    assert row(mup) == "embed 0.0006, matrix 0.0064/0.0072"
    assert row(SimpleNamespace(summary={})) is None  # a run from before the key
