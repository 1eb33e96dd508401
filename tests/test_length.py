"""The run's length in tokens per parameter (runtime/length.py) and one length per claim (reproduce/length.py)."""

from __future__ import annotations

import json

import pytest
import yaml

from normbench.claims.registry import cpu_mode, load_claim
from normbench.errors import ConfigError
from normbench.reproduce.length import pin
from normbench.reproduce.shared import check_claim
from normbench.runtime import length

from conftest import run_cli


def test_length_params_counts_the_weight_matrices_by_hand(tiny_cfg):
    cfg = tiny_cfg("model.n_layer=4", "norm=layernorm")
    import torch

    from normbench.model import build_model

    model = build_model(cfg, 256)
    d_ff = model.blocks[0].mlp.core.c_fc.weight.shape[0] // 2  # SwiGLU: gate and up in one matrix
    d = 64
    expected = 256 * d + 4 * (4 * d * d + 3 * d * d_ff)
    assert length.length_params(cfg, 256) == expected == length.count_matrices(model)
    total = sum(p.numel() for p in model.parameters())
    assert 0 < total - expected == sum(p.numel() for p in model.parameters() if p.dim() == 1)
    # a placement with more norms has the same N; torch builds nothing on the meta count
    peri = tiny_cfg("model.n_layer=4", "norm=layernorm", "arch=peri_ln")
    assert length.length_params(peri, 256) == expected
    assert torch.get_default_device().type == "cpu"


def test_tokens_per_param_sets_the_steps(tiny_cfg):
    cfg = tiny_cfg("model.n_layer=4", "trainer.tokens_per_param=20", "trainer.batch_size=8")
    n = length.length_params(cfg)
    assert length.run_steps(cfg) == round(20 * n / (8 * 64))
    assert length.run_steps(tiny_cfg("trainer.max_steps=7")) == 7
    both = tiny_cfg("trainer.tokens_per_param=20", "trainer.max_tokens=1000")
    with pytest.raises(ConfigError, match="set one of them"):
        length.run_steps(both)


def test_bad_tokens_per_param_is_one_line(tmp_path):
    r = run_cli(["train", "model=tiny", "trainer.tokens_per_param=-1", f"hydra.run.dir={tmp_path}/r"], tmp_path)
    assert r.returncode == 2
    assert "normbench: error: trainer.tokens_per_param=-1.0 must be a positive number" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_run_prints_and_records_its_length(tmp_path):
    run = tmp_path / "r"
    args = [
        "train",
        "model=tiny",
        "trainer.tokens_per_param=0.05",
        "trainer.batch_size=4",
        "diag=off",
        "trainer.eval_every=1000",
        f"hydra.run.dir={run}",
    ]
    r = run_cli(args, tmp_path, check=True)
    s = json.loads((run / "summary.json").read_text())
    n = s["length_params"]
    steps = round(0.05 * n / (4 * 64))
    assert s["max_steps"] == s["step"] == steps and s["tokens"] == steps * 4 * 64
    assert s["tokens_per_param"] == pytest.approx(steps * 256 / n, abs=1e-4)
    assert f"length: {steps:,} steps x 256 tokens" in r.stdout + r.stderr
    assert "tokens per parameter" in (run / "train.log").read_text()


def _claim(tmp_path, sweeps, fixed, scale_extra=None):
    raw = {
        "claim": "made up",
        "paper": "nobody",
        "scales": {"cpu": {"seeds": 3, "fixed": fixed, "sweeps": sweeps, **(scale_extra or {})}},
        "tests": [
            {
                "name": "loss",
                "kind": "difference",
                "metric": "best_val_loss",
                "group": {"arch": "simplenorm"},
                "baseline": {"arch": "pre_ln"},
                "threshold": 0.05,
            }
        ],
        "part_of_claim": {"init_std": "SimpleNorm's own N(0, 1) embedding and 0.02 init"},
    }
    (tmp_path / "madeup.yaml").write_text(yaml.safe_dump(raw))
    return load_claim("madeup", tmp_path)


def test_sides_that_would_train_different_tokens_are_refused(tmp_path):
    # SimpleNorm's untied head: more weight matrices, so per-job tokens_per_param gives it a longer run
    claim = _claim(tmp_path, [{"arch": ["pre_ln", "simplenorm"]}], ["model=tiny", "trainer.tokens_per_param=20"])
    with pytest.raises(ConfigError, match="would train different numbers of tokens") as err:
        check_claim(claim, "cpu")
    assert "\n" not in str(err.value)


def test_a_claim_length_is_pinned_from_its_baseline(tmp_path):
    claim = _claim(tmp_path, [{"arch": ["pre_ln", "simplenorm"]}], ["model=tiny"], {"tokens_per_param": 20})
    pinned = pin(claim, "cpu")
    from normbench.config.files import compose_config

    base = compose_config(["model=tiny", "arch=pre_ln"])
    assert pinned.reference == {"arch": "pre_ln"} and pinned.params == length.length_params(base)
    assert pinned.steps == round(20 * pinned.params / (16 * 64))
    check_claim(claim, "cpu", [pinned.override])  # one max_steps for both sides: accepted
    assert pin(claim, "cpu", ["trainer.max_steps=5"]) is None  # the user's length wins


def test_quick_scale_is_the_cpu_sweep_with_its_own_length(tmp_path):
    raw = {
        "claim": "made up",
        "paper": "nobody",
        "scales": {
            "cpu": {"like": "quick", "tokens_per_param": 20},
            "quick": {
                "seeds": 3,
                "fixed": ["model=tiny", "trainer.max_steps=200", "diag.every=50"],
                "sweeps": [{"arch": ["pre_ln", "peri_ln"]}],
            },
        },
        "tests": [
            {
                "name": "v",
                "kind": "difference",
                "metric": "var_growth",
                "group": {"arch": "peri_ln"},
                "baseline": {"arch": "pre_ln"},
                "threshold": 0.4,
            }
        ],
    }
    (tmp_path / "madeup.yaml").write_text(yaml.safe_dump(raw))
    c = load_claim("madeup", tmp_path)
    assert c.sweep("cpu").fixed == (*cpu_mode(), "model=tiny", "diag.every=50")  # the claims' mode first
    assert c.sweep("cpu").tokens_per_param == 20 and "precision=bf16" not in c.sweep("quick").fixed
    assert c.sweep("quick").fixed[1] == "trainer.max_steps=200" and c.sweep("quick").tokens_per_param is None
    assert c.sweep("cpu").sweeps == c.sweep("quick").sweeps


def _saved_seconds(cfg, **rate) -> float:
    """compile=auto's estimated saving for a composed job (runtime/compiling.py), its model on meta."""
    import torch

    from normbench.model import build_model
    from normbench.runtime import compiling

    with torch.device("meta"):
        model = build_model(cfg, length.config_vocab(cfg))
    line = compiling.decide(cfg, model, torch.device("cpu"), **rate).reason
    return float(line.split(" saving = ")[1].split(" s ")[0])


def test_the_mode_pin_times_a_jobs_step_on_its_own_threads_at_the_calibrated_rate(tmp_path, monkeypatch):
    """pin_compile reads the dry run's calibrated rate of this CPU (estimate.cpu_rate), per thread, times the
    threads each job gets: one under jobs=N, where the estimate's CPU-seconds are counted too."""
    import torch

    from normbench.model import build_model
    from normbench.reproduce import estimate
    from normbench.reproduce.length import pin_compile
    from normbench.reproduce.shared import compose_jobs
    from normbench.runtime import compiling

    monkeypatch.setattr(estimate, "cpu_rate", lambda: 1e10)
    claim = _claim(tmp_path, [{"arch": ["pre_ln", "post_ln"]}], ["model=tiny", "trainer.max_steps=300000"])
    cfg = {v["arch"]: c for v, c in compose_jobs(claim, "cpu", ["compile=auto"])}["pre_ln"]
    prof = compiling.PROFILES["cpu"]
    with torch.device("meta"):
        model = build_model(cfg, length.config_vocab(cfg))
    step_tokens = cfg.trainer.batch_size * cfg.trainer.grad_accum * cfg.model.seq_len
    step_s = compiling.model_flops_per_token(model, cfg.model) * step_tokens / 1e10  # d 64: the rate as measured
    saved = 300000 * step_s * prof.saving_at(cfg.model.d_model)
    one = pin_compile(claim, "cpu", ["compile=auto"], threads=1)
    assert f"~{step_s:.3g} s/step" in one.reason and f"saving = {saved:.0f} s" in one.reason
    two = pin_compile(claim, "cpu", ["compile=auto"], threads=2)
    assert f"~{step_s / 2:.3g} s/step" in two.reason  # two threads: half the step
    assert _saved_seconds(cfg, threads=1, thread_flops=1e10) == pytest.approx(saved, abs=0.5)


def test_compile_auto_is_one_mode_for_every_job_decided_at_the_baseline(tmp_path, monkeypatch):
    from normbench.reproduce import estimate
    from normbench.reproduce.length import pin_compile
    from normbench.reproduce.shared import compose_jobs
    from normbench.runtime import compiling

    claim = _claim(tmp_path, [{"arch": ["pre_ln", "simplenorm"]}], ["model=tiny", "trainer.max_steps=300000"])
    assert pin_compile(claim, "cpu", ["compile=false"]) is None  # the user's compile=false over the mode's auto
    assert pin_compile(claim, "cpu", ["compile=auto", "compile=false"]) is None  # the last one wins
    assert pin_compile(claim, "cpu") is not None  # the claims' mode (registry.cpu_mode) asks for compile=auto
    assert pin_compile(load_claim("peri_variance"), "quick") is None  # quick has no mode: nothing asks for it
    from normbench.reproduce.length import asks_auto

    (tmp_path / "swept").mkdir()
    swept = _claim(tmp_path / "swept", [{"arch": ["pre_ln", "simplenorm"], "compile": ["auto"]}], ["model=tiny"])
    assert asks_auto(swept, "cpu", []) and not asks_auto(swept, "cpu", ["compile=false"])  # the user's wins
    jobs = {v["arch"]: cfg for v, cfg in compose_jobs(claim, "cpu", ["compile=auto"])}
    pre, simple = _saved_seconds(jobs["pre_ln"]), _saved_seconds(jobs["simplenorm"])
    assert simple > pre  # SimpleNorm's untied head: more FLOPs per step, a larger estimated saving
    # a compile time between the two (cold and warm alike): decided per job, the sides would run in different modes
    prof, mid = compiling.PROFILES["cpu"], (pre + simple) / 2
    monkeypatch.setitem(compiling.PROFILES, "cpu", compiling.Profile(prof.eager_flops, prof.saving, mid, mid))
    monkeypatch.setattr(estimate, "cpu_rate", lambda: prof.eager_flops)  # pin_compile's rate: the profile's
    assert _saved_seconds(jobs["simplenorm"]) > (pre + simple) / 2 > _saved_seconds(jobs["pre_ln"])
    mode = pin_compile(claim, "cpu", ["compile=auto"])
    assert mode.compile is False and mode.override == "compile=false"  # the baseline's (Pre-LN's) decision
    assert "compile=auto:" in mode.reason and "shared by 3 runs" in mode.reason  # the claim's 3 seeds
    pinned = compose_jobs(claim, "cpu", ["compile=auto", mode.override])
    assert {cfg.compile for _, cfg in pinned} == {False}


def test_a_claims_seeds_share_one_cold_compile():
    from normbench.runtime.compiling import Profile

    prof = Profile(eager_flops=1e10, saving=0.1, compile_s=40.0, warm_s=4.0)
    assert prof.compile_cost() == 40.0  # one run pays the cold compile
    assert prof.compile_cost(3) == 4.0 + 36.0 / 3  # the first of 3 pays it, the other two find the cache warm


def test_the_pins_set_their_keys_as_composing_with_them_would(tmp_path, monkeypatch):
    """reproduce composes a claim's jobs once (reproduce/plan.py): the length and mode pins are set in the
    composed configs, and those configs equal the ones composed with the pins' overrides appended (key for key)."""
    from normbench.reproduce import plan as plans
    from normbench.reproduce import shared
    from normbench.reproduce.length import pin
    from normbench.run.resume import flat_config

    claim = _claim(tmp_path, [{"arch": ["pre_ln", "simplenorm"]}], ["model=tiny"], {"tokens_per_param": 20})
    p = plans.Plan(claim, "cpu", None, ["compile=auto"], tmp_path, plans.compose(claim, "cpu", ["compile=auto"]))
    steps = pin(claim, "cpu", ["compile=auto"], jobs=p.pairs).steps
    assert steps == pin(claim, "cpu", ["compile=auto"]).steps  # the same baseline and length either way
    p.set(f"trainer.max_steps={steps}", steps)
    p.set("compile=true", True)
    again = shared.compose_jobs(claim, "cpu", ["compile=auto", f"trainer.max_steps={steps}", "compile=true"])
    assert [(v, flat_config(c)) for v, c in p.pairs] == [(v, flat_config(c)) for v, c in again]
    assert {c.compile for _, c in p.pairs} == {True} and {c.trainer.max_steps for _, c in p.pairs} == {steps}
    assert p.overrides == ["compile=auto", f"trainer.max_steps={steps}", "compile=true"]
    (tmp_path / "swept").mkdir()  # a swept key is composed again: the override changes the grid
    grid = [{"arch": ["pre_ln", "simplenorm"], "compile": ["auto", "false"]}, {"arch": ["ngpt"]}]
    swept = _claim(tmp_path / "swept", grid, ["model=tiny"])
    p = plans.Plan(swept, "cpu", None, [], tmp_path, plans.compose(swept, "cpu"))
    assert [j.sweep for j in p.jobs] == [0, 0, 0, 0, 1]
    p.set("compile=false", False)
    assert {c.compile for _, c in p.pairs} == {False}
    assert [(j.sweep, j.values) for j in p.jobs] == [
        (0, {"arch": "pre_ln"}),
        (0, {"arch": "simplenorm"}),
        (1, {"arch": "ngpt"}),
    ]
    calls = []
    real = shared.compose
    monkeypatch.setattr(shared, "compose", lambda *a: calls.append(a) or real(*a))
    p = plans.build(claim, "cpu", None, ["compile=auto"], tmp_path, log=lambda _: None)
    assert p.overrides == ["compile=auto", p.pinned.override, p.mode.override]
    shared.check_claim(claim, "cpu", p.users, p.pairs)
    assert len(calls) == 2  # each of the two jobs composed once, through both pins and the shared check


def test_a_scale_is_typed_once_and_an_unknown_key_is_one_line(tmp_path):
    """A claim's scale is parsed once into a typed Scale: seeds an int, the ladders' rungs typed, and a key
    the parser does not know refused with the allowed ones named (a typo would otherwise be ignored)."""
    raw = {
        "claim": "x",
        "paper": "y",
        "tests": [
            {
                "name": "t",
                "kind": "difference",
                "metric": "best_val_loss",
                "group": {"arch": "post_ln"},
                "baseline": {"arch": "pre_ln"},
                "threshold": 0.01,
            }
        ],
        "scales": {
            "cpu": {
                "seeds": 4,
                "sweeps": [{"arch": ["pre_ln", "post_ln"]}],
                "duration": [5, 1],
                "ladder": [["model.d_model=64"]],
            }
        },
    }
    (tmp_path / "typed.yaml").write_text(yaml.safe_dump(raw))
    s = load_claim("typed", tmp_path).sweep("cpu")
    assert (s.name, s.seeds, s.duration, s.ladder, s.tokens_per_param) == (
        "cpu",
        4,
        (5.0, 1.0),
        (("model.d_model=64",),),
        None,
    )
    raw["scales"]["cpu"]["seed"] = 3
    (tmp_path / "typo.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"scales.cpu: unknown key\(s\) seed; allowed: at, duration, fixed"):
        load_claim("typo", tmp_path)
