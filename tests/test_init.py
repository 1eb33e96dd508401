"""The width-transferred init (model.init_std: auto | fan_in | a number) and one init per comparison:
the values by hand, the refusals, old runs' keys on resume, and reproduce's shared-key check."""

from __future__ import annotations

import math
import shutil

import pytest
import torch
import yaml

from normbench.claims.registry import claims_dir, load_claim
from normbench.config.schema import init_std_of, upgrade_legacy
from normbench.errors import ConfigError
from normbench.model import build_model, weight_init_std
from normbench.reproduce.request import Request
from normbench.reproduce.shared import check_claim
from normbench.run.resume import check_resume_config, flat_config

from conftest import compose


def test_rules_by_hand():
    assert init_std_of("auto", 768) == pytest.approx(0.02)  # GPT-2's own number at its own width
    assert init_std_of("auto", 64) == pytest.approx(0.02 * math.sqrt(12))  # 0.0693: the same gain, 0.554
    assert init_std_of("auto", 128) == pytest.approx(0.04899, abs=1e-5)
    assert init_std_of("fan_in", 64) == 0.125
    assert init_std_of(0.02, 64) == 0.02


@pytest.mark.parametrize(
    "overrides, std",
    [
        (["model=tiny"], 0.02 * math.sqrt(768 / 64)),
        (["model=small"], 0.02 * math.sqrt(768 / 128)),
        (["model=tiny", "model.init_std=fan_in"], 0.125),
        (["model=tiny", "model.init_std=0.02"], 0.02),
        (["model=gpt2_124m", "model.n_layer=1"], 0.02),  # the reference preset keeps GPT-2's number
        (["model=tiny", "arch=hybridnorm"], math.sqrt(2 / (5 * 64))),  # its paper's small init
        (["model=tiny", "arch=ngpt"], 0.125),
        (["model=tiny", "arch=simplenorm"], 0.02),
    ],
)
def test_weight_init_std_is_what_the_model_draws(overrides, std):
    cfg = compose(overrides)
    assert weight_init_std(cfg) == pytest.approx(std)
    if cfg.arch.name in ("pre_ln", "hybridnorm") and cfg.model.d_model <= 128:
        torch.manual_seed(0)
        model = build_model(cfg, 4096)  # a big embedding: its std is measured to ~1%
        assert model.wte.weight.std().item() == pytest.approx(std, rel=0.03)


def test_a_number_draws_exactly_what_it_drew_before():
    """model.init_std=0.02 is the old default: the same generator calls, so the same bits as N(0, 0.02)
    drawn in module order (embedding after the Linears, output projections redrawn at std/sqrt(2L))."""
    cfg = compose(["model=tiny", "model.init_std=0.02", "model.n_layer=1"])
    torch.manual_seed(0)
    model = build_model(cfg, 256)
    torch.manual_seed(0)
    twin = build_model(cfg, 256)  # the same config, the same seed
    std = model.blocks[0].attn.core.c_attn.weight.std().item()
    assert std == pytest.approx(0.02, rel=0.05)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), twin.state_dict().values()))


@pytest.mark.parametrize("bad", ["wide", "-0.1", "0", "true"])
def test_bad_init_std_refused_in_one_line(bad):
    from normbench.validation import to_config

    with pytest.raises(ConfigError) as exc:
        to_config(compose(["model=tiny", f"model.init_std={bad}"]))
    msg = str(exc.value)
    assert "\n" not in msg and "model.init_std" in msg and "auto, fan_in" in msg


def test_old_width_init_runs_resume_as_what_they_computed(tmp_path):
    """A DyT run made with norm.width_init=true drew N(0, d^-0.5): it resumes under fan_in (or the number),
    not under auto; an old run at 0.02 is refused under auto, naming the key."""
    new = flat_config(compose(["model=tiny", "norm=dyt", "model.init_std=fan_in"]))
    old = {**new, "model.init_std": 0.02, "norm.width_init": True}
    assert upgrade_legacy(old)["model.init_std"] == 0.125 and "norm.width_init" not in upgrade_legacy(old)
    assert check_resume_config(old, new, [], tmp_path) == []
    auto = flat_config(compose(["model=tiny", "norm=dyt"]))
    with pytest.raises(ConfigError, match=r"model.init_std"):
        check_resume_config(old, auto, [], tmp_path)
    plain_old = {**auto, "model.init_std": 0.02, "norm.width_init": False}
    with pytest.raises(ConfigError, match=r"model.init_std \(0.02 -> auto\)"):
        check_resume_config(plain_old, auto, [], tmp_path)
    same = {**auto, "model.init_std": init_std_of("auto", 64)}  # a run that drew auto's number
    assert check_resume_config(same, auto, [], tmp_path) == []


@pytest.mark.parametrize(
    "overrides, noted",
    [
        (["norm=dyt"], True),  # auto is drawn: GPT-2's gain, far from DyT's references
        (["norm=derf"], True),
        (["norm=dyt", "model.init_std=fan_in"], False),
        (["norm=dyt", "arch=hybridnorm"], False),  # its small init is drawn, not auto
        (["norm=layernorm"], False),
    ],
)
def test_dyt_at_auto_gets_a_start_up_note(overrides, noted):
    from normbench.model import check_combination

    notes = check_combination(compose(["model=tiny", *overrides]))
    assert any("model.init_std=fan_in" in n for n in notes) == noted


def test_a_runs_init_is_the_recorded_one_else_what_its_config_computed():
    from normbench.analysis.loading import Run
    from normbench.claims.measure import run_init
    from normbench.config.schema import as_dict

    def run(config, summary):
        return Run(path=None, config=config, overrides=[], summary=summary, records=[])

    cfg = as_dict(compose(["model=tiny"]))
    assert run_init(run(cfg, {"init_std": 0.05})) == 0.05  # what the run wrote at its start wins
    assert run_init(run(cfg, {})) == pytest.approx(init_std_of("auto", 64))
    old = {**cfg, "model": {**cfg["model"], "init_std": 0.02}, "norm": {**cfg["norm"], "width_init": True}}
    assert run_init(run(old, {})) == 0.125  # an old norm.width_init run drew d^-0.5
    assert run_init(run({}, {})) is None


def test_malformed_part_of_claim_is_refused_in_one_line(tmp_path):
    (tmp_path / "bad.yaml").write_text(
        yaml.safe_dump(
            {
                "claim": "x",
                "paper": "y",
                "part_of_claim": {"init_std": ""},
                "scales": {"cpu": {"sweeps": [{"norm": ["layernorm"]}]}},
                "tests": [
                    {
                        "name": "t",
                        "kind": "on_par",
                        "metric": "best_val_loss",
                        "group": {"norm": "dyt"},
                        "baseline": {"norm": "layernorm"},
                        "band": [-0.05, 0.05],
                    }
                ],
            }
        )
    )
    with pytest.raises(ConfigError) as exc:
        load_claim("bad", tmp_path)
    assert "part_of_claim" in str(exc.value) and "\n" not in str(exc.value)


# ------------------------------------------------------------------ one init per comparison (reproduce)


def _claim(tmp_path, sweeps, part_of_claim=None):
    raw = {
        "claim": "DyT on par",
        "paper": "made up",
        "scales": {"cpu": {"seeds": 3, "fixed": ["model=tiny", "trainer.max_steps=10"], "sweeps": sweeps}},
        "tests": [
            {
                "name": "on par",
                "kind": "on_par",
                "metric": "best_val_loss",
                "group": {"norm": "dyt"},
                "baseline": {"norm": "layernorm"},
                "band": [-0.05, 0.05],
            },
        ],
    }
    if part_of_claim:
        raw["part_of_claim"] = part_of_claim
    (tmp_path / "madeup.yaml").write_text(yaml.safe_dump(raw))
    return load_claim("madeup", tmp_path)


def test_shipped_norm_comparisons_share_one_init():
    inits = check_claim(load_claim("dyt_parity"), "cpu")  # LayerNorm, DyT and Derf at the claim's fan_in
    assert {v for sides in inits.values() for vals in sides.values() for v in vals} == {0.125}
    inits = check_claim(load_claim("rmsnorm_parity"), "cpu")  # the preset's auto
    assert {v for sides in inits.values() for vals in sides.values() for v in vals} == {init_std_of("auto", 64)}


def test_groups_with_different_inits_are_refused(tmp_path):
    claim = _claim(tmp_path, [{"norm": ["layernorm"]}, {"norm": ["dyt"], "model.init_std": [0.125]}])
    with pytest.raises(ConfigError) as exc:
        check_claim(claim, "cpu")
    assert "\n" not in str(exc.value) and "init_std 0.125" in str(exc.value) and "part_of_claim" in str(exc.value)


def test_groups_differing_in_an_unswept_key_are_refused_unless_declared(tmp_path):
    sweeps = [{"norm": ["layernorm"]}, {"norm": ["dyt"], "trainer.grad_clip": [0.5]}]
    with pytest.raises(ConfigError) as exc:
        check_claim(_claim(tmp_path, sweeps), "cpu")
    assert "differ in trainer.grad_clip (0.5 for" in str(exc.value) and "\n" not in str(exc.value)
    assert check_claim(_claim(tmp_path, sweeps, {"trainer.grad_clip": "DyT's recipe clips harder"}), "cpu")


def test_a_norm_swept_with_its_own_keys_passes(tmp_path):
    """Keys under the swept section (norm.*) are what the test is about; an LR grid pairs LR with LR."""
    claim = _claim(tmp_path, [{"norm": ["layernorm", "dyt"], "optim.lr": ["1e-3", "3e-3"]}])
    assert check_claim(claim, "cpu")["on par"] == {
        "group": [init_std_of("auto", 64)],
        "baseline": [init_std_of("auto", 64)],
    }


def test_dry_run_prints_one_init_and_a_refused_claim_names_the_key(tmp_path, capsys, monkeypatch):
    from normbench.reproduce import main

    assert main(["dyt_parity", "--dry-run", f"out={tmp_path}"]) == 0
    out = capsys.readouterr().out
    assert out.count("both from init_std 0.125") == 2
    bad = tmp_path / "claims"
    shutil.copytree(claims_dir(), bad)
    monkeypatch.setattr("normbench.claims.registry.claims_dir", lambda: bad)
    raw = yaml.safe_load((bad / "ngpt_speed.yaml").read_text())
    del raw["part_of_claim"]
    (bad / "ngpt_speed.yaml").write_text(yaml.safe_dump(raw))
    assert main(["ngpt_speed", "--dry-run", f"out={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "different inits" in err and "ngpt" in err


# ------------------------------------------------------------------ the paired interval (common random numbers)


def test_paired_interval_by_hand():
    """Per-seed differences 0.1, 0.05, 0.15: mean 0.1, sd 0.05, se 0.05/sqrt(3), t(0.975, 2) = 4.3027
    -> half 0.1242. Welch's interval on the same numbers spans the seeds' own spread (sd 1)."""
    from normbench.claims import verdict as V

    xs, base = [1.0, 2.0, 3.0], [0.9, 1.95, 2.85]
    effect, ci = V.interval(xs, base, paired=True)
    assert effect == pytest.approx(0.1)
    assert ci == pytest.approx([0.1 - 0.12421, 0.1 + 0.12421], abs=1e-4)
    _, welch = V.interval(xs, base)
    assert welch[1] - welch[0] > 10 * (ci[1] - ci[0])
    assert V.judge_on_par(xs, base, [-0.3, 0.3], paired=True)["verdict"] == V.HOLDS
    assert V.judge_on_par(xs, base, [-0.3, 0.3])["verdict"] == V.INCONCLUSIVE


def test_judge_pairs_by_seed_only_when_both_sides_ran_the_same_seeds():
    from normbench.analysis.loading import Run
    from normbench.claims.measure import seed_pairs

    def run(norm, seed, loss):
        summary = {"status": "completed", "outcome": "learned", "norm": norm, "seed": seed, "best_val_loss": loss}
        return Run(path=None, config={}, overrides=[f"norm={norm}", f"seed={seed}"], summary=summary, records=[])

    g = [run("dyt", s, v) for s, v in ((1, 2.0), (0, 1.0), (2, 3.0))]
    b = [run("layernorm", s, v) for s, v in ((0, 0.9), (1, 1.95), (2, 2.85))]
    value = lambda r: r.summary["best_val_loss"]
    assert seed_pairs(g, b, value, None) == [(1.0, 0.9), (2.0, 1.95), (3.0, 2.85)]
    assert seed_pairs(g, b[:2], value, None) is None  # seed 2 has no partner: Welch
    assert seed_pairs(g, [run("layernorm", 0, -1.0), *b[1:]], value, "log") is None  # a log of <= 0


# ------------------------------------------------------------------ the scale ladder


@pytest.mark.parametrize("param", ["sp", "mup"])
def test_ladder_runs_each_rung_and_writes_json_and_figure(tmp_path, monkeypatch, param):
    """Each rung is one reproduce call with its width (the claim's own width: no override, its own
    sweep; under muP, d_base); ladder.json (SP: ladder_sp.json) holds effect and interval per rung and test;
    the figure is drawn."""
    import json

    from normbench.reproduce import runner
    from normbench.reproduce.ladders import rungs
    from normbench.reproduce.ladders import scale as ladder

    calls = []

    def fake(claim, req, log=print, **_):
        calls.append((list(req.overrides), req.out))
        d = next((int(o.split("=")[1]) for o in req.overrides if o.startswith("model.d_model=")), 64)
        effect = 0.1 * (d / 64)  # grows with the width
        tests = [
            {
                "name": t.name,
                "kind": t.kind,
                "verdict": "HOLDS",
                "effect": effect,
                "ci": [effect - 0.05, effect + 0.05],
                "threshold": t.band,
                "direction": None,
                "transform": None,
                "interval": "paired",
                "n_seeds": 3,
                "informative": False,
                "reason": None,
            }
            for t in claim.tests
        ]
        length = {"steps": 200, "reached": [0.9 * (64 / d) ** 2, 1.0]}  # one length, fewer tokens per param
        return {"verdict": "HOLDS", "tests": tests, "run_time_s": d, "length": length}

    monkeypatch.setattr(runner, "reproduce", fake)
    claim = load_claim("dyt_parity")
    res = ladder.run_ladder(claim, Request(out=tmp_path, ladder_param=param), log=lambda *_: None)
    mup = {
        "sp": lambda d: [],
        "mup": lambda d: [
            f"model.n_head={d // 16}",
            "model.param=mup",
            "model.mup_base_width=64",
            "model.mup_head_dim=16",
        ],
    }[param]
    assert [c[0] for c in calls] == [[], ["model.d_model=128", *mup(128)], ["model.d_model=256", *mup(256)]]
    assert calls[0][1] == tmp_path  # the claim's own sweep at its own width
    tag = "-mup" if param == "mup" else ""
    assert calls[2][1] == tmp_path / "dyt_parity" / "ladder" / f"d256-L4{tag}"
    name = "ladder" if param == "mup" else "ladder_sp"
    saved = json.loads((tmp_path / "dyt_parity" / f"{name}.json").read_text())
    assert saved["param"] == param
    assert saved == json.loads(json.dumps(res))
    assert [r["d_model"] for r in saved["rungs"]] == [64, 128, 256] and saved["run_time_s"] == 448
    assert saved["rungs"][2]["tests"][0]["effect"] == pytest.approx(0.4)
    assert saved["rungs"][0]["tests"][1]["ci"] == pytest.approx([0.05, 0.15])
    assert (tmp_path / "dyt_parity" / f"{name}.png").stat().st_size > 10_000
    # what each rung trained goes into the figure's title: the width trend is not a length trend
    assert [r["steps"] for r in saved["rungs"]] == [200, 200, 200]
    assert [r["tokens_per_param"] for r in saved["rungs"]] == pytest.approx([0.9, 0.225, 0.05625])
    assert rungs._lengths(saved["rungs"]) == "200 steps at every width (0.9 / 0.23 / 0.056 tokens per parameter)"


def test_ladder_flag_refuses_a_bad_value(capsys):
    from normbench.reproduce import main

    assert main(["dyt_parity", "ladder=yes"]) == 2
    err = capsys.readouterr().err
    assert "ladder=yes" in err and "true, false" in err and err.count("\n") == 1
