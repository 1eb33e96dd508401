"""`normbench reproduce`: the verdict rule on made-up numbers and runs, the claims registry, the CLI,
and one end-to-end claim on a tiny model (slow)."""

from __future__ import annotations

import json
import math
import re
import shutil
import statistics
import subprocess

import pytest
import yaml

from normbench.analysis.loading import find_runs
from normbench.claims import registry as claims
from normbench.claims import summary as claim_summary
from normbench.claims import verdict as V
from normbench.claims.measure import judge_claim
from normbench.claims.registry import claim_ids, load_claim
from normbench.errors import ConfigError
from normbench.reproduce.request import Request, parse
from normbench.runtime.precision import cpu_native_bf16

CONTRACT = [
    "deepnorm_depth",
    "dyt_parity",
    "grad_profile",
    "layer_redundancy",
    "massive_early",
    "ngpt_speed",
    "norm_gain_wd",
    "normfree_stable",
    "normformer_grads",
    "optimizer_lr",
    "peri_variance",
    "postln_warmup",
    "qknorm_lr",
    "rmsnorm_parity",
    "simplenorm_lr",
    "sandwich_spikes",
]
CONTRACT = sorted([*CONTRACT, "crmsnorm_parity", "seednorm_gain", "powernorm_gap", "qkclip_logits"])


# ----------------------------------------------------------------------------- the rule on numbers


def test_welch_interval_by_hand():
    # diff -3, each variance 1 -> se sqrt(2/3), Welch df 4, t(0.975, 4) = 2.7764 -> half 2.2669
    r = V.judge_difference([1, 2, 3], [4, 5, 6], "lower", 1.0)
    assert r["effect"] == pytest.approx(-3)
    assert r["ci"] == pytest.approx([-5.2669, -0.7331], abs=1e-3)
    assert r["verdict"] == V.HOLDS


def test_difference_present_absent_reversed_wide():
    base = [2.0, 2.1, 1.9]
    assert V.judge_difference([1.0, 1.1, 0.9], base, "lower", 0.5)["verdict"] == V.HOLDS
    absent = V.judge_difference([2.0, 2.01, 1.99], [2.005, 1.995, 2.0], "lower", 0.5)
    assert absent["verdict"] == V.FAILS and "band of no meaningful effect" in absent["reason"]
    reversed_ = V.judge_difference([3.0, 3.1, 2.9], base, "lower", 0.5)
    assert reversed_["verdict"] == V.FAILS and "other side of zero" in reversed_["reason"]
    assert V.judge_difference([3.0, 3.1, 2.9], base, "higher", 0.5)["verdict"] == V.HOLDS
    wide = V.judge_difference([0.0, 2.0, 4.0], base, "lower", 0.5)
    assert wide["verdict"] == V.INCONCLUSIVE and "too wide" in wide["reason"]
    # the claimed sign and an interval off zero, but smaller than the threshold: inside (0, threshold)
    small = V.judge_difference([1.8, 1.81, 1.79], base, "lower", 0.5)
    assert small["verdict"] == V.FAILS


def test_too_few_seeds_and_bad_runs_are_inconclusive():
    r = V.judge_difference([1.0, 1.1], [2.0, 2.1], "lower", 0.5)
    assert r["verdict"] == V.INCONCLUSIVE and "too few seeds" in r["reason"]
    assert r["effect"] == pytest.approx(-1.0)  # still reported
    r = V.judge_difference([1.0, 1.1, 0.9], [2.0, 2.1, 1.9], "lower", 0.5, problems=["arch=x: 1 diverged of 3"])
    assert r["verdict"] == V.INCONCLUSIVE and "diverged" in r["reason"]


def test_one_sample_against_a_number():
    assert V.judge_difference([0.1, 0.12, 0.08], 0.25, "lower", 0.05)["verdict"] == V.HOLDS
    never = V.judge_difference([1.0, 1.0, 1.0], 0.25, "lower", 0.05)  # never crossed: the run's end
    assert never["verdict"] == V.FAILS and never["effect"] == pytest.approx(0.75)


def test_on_par():
    base = [2.0, 2.01, 1.99]
    assert V.judge_on_par([2.001, 2.011, 1.991], base, [-0.05, 0.05])["verdict"] == V.HOLDS
    out = V.judge_on_par([2.3, 2.31, 2.29], base, [-0.05, 0.05])
    assert out["verdict"] == V.FAILS and out["effect"] == pytest.approx(0.3)
    assert V.judge_on_par([1.9, 2.1, 2.0], base, [-0.05, 0.05])["verdict"] == V.INCONCLUSIVE
    assert V.judge_on_par([2.0, 2.0], [2.0, 2.0], [-0.05, 0.05])["verdict"] == V.INCONCLUSIVE


def test_outcome_newcombe_interval_by_hand():
    # Wilson(3/3) = (0.4385, 1), Wilson(0/3) = (0, 0.5615): lower = 1 - sqrt(2 * 0.5615^2) = 0.2059
    r = V.judge_outcome(3, 3, 0, 3, "higher", 0.5)
    assert r["verdict"] == V.HOLDS and r["effect"] == 1
    assert r["ci"] == pytest.approx([0.2059, 1.0], abs=1e-3)
    assert V.judge_outcome(3, 3, 3, 3, "higher", 0.5)["verdict"] == V.INCONCLUSIVE  # 0 effect, wide
    assert V.judge_outcome(0, 3, 3, 3, "higher", 0.5)["verdict"] == V.FAILS


def test_largest_lr():
    grid = [1e-3, 3e-3, 1e-2, 3e-2]
    assert V.judge_largest_lr(1e-2, 3e-3, grid, 1, 3, 3)["verdict"] == V.HOLDS
    assert V.judge_largest_lr(3e-3, 3e-3, grid, 1, 3, 3)["verdict"] == V.FAILS
    nowhere = V.judge_largest_lr(1e-3, None, grid, 1, 3, 3)  # the baseline learned at no LR: below the grid, or
    assert nowhere["effect"] == 1 and nowhere["verdict"] == V.INCONCLUSIVE  # not at all? (Lion at 200 steps)
    assert "no LR of the grid learned with every seed in the baseline" in nowhere["reason"]
    assert V.judge_largest_lr(None, 1e-2, grid, 1, 3, 3, direction="lower")["verdict"] == V.INCONCLUSIVE
    top = V.judge_largest_lr(3e-2, 3e-2, grid, 1, 3, 3)
    assert top["verdict"] == V.INCONCLUSIVE and "widen the grid" in top["reason"]
    assert V.judge_largest_lr(1e-3, 3e-3, grid, 1, 3, 3, direction="lower")["verdict"] == V.HOLDS
    assert V.judge_largest_lr(1e-2, 3e-3, grid, 1, 2, 3)["verdict"] == V.INCONCLUSIVE


def test_combine():
    assert V.combine([V.HOLDS, V.HOLDS]) == V.HOLDS
    assert V.combine([V.HOLDS, V.INCONCLUSIVE]) == V.INCONCLUSIVE
    assert V.combine([V.INCONCLUSIVE, V.FAILS]) == V.FAILS


# ----------------------------------------------------------------------------- the rule on runs


def fake_run(path, arch, seed, status="completed", outcome="learned", loss=2.0, var_growth=10.0, extra=()):
    (path / ".hydra").mkdir(parents=True)
    overrides = [f"arch={arch}", f"seed={seed}", *extra]
    (path / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (path / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"arch": {"name": arch}, "seed": seed}))
    summary = {
        "status": status,
        "arch": arch,
        "seed": seed,
        "outcome": outcome,
        "max_steps": 100,
        "best_val_loss": loss if status == "completed" else None,
        "layer_series": {"var_growth": []},
        "var_growth": var_growth if status == "completed" else None,
    }
    (path / "summary.json").write_text(json.dumps(summary))


# compile=false: a made-up claim's cpu scale trains eager (the claims' mode, registry.CPU_MODE, would pin compile=auto)
def write_claim(
    directory, tests, sweeps=({"arch": ["pre_ln", "peri_ln"]},), fixed=("model=tiny", "compile=false"), seeds=3
):
    raw = {
        "claim": "a made-up claim",
        "paper": "nobody 2025",
        "scales": {"cpu": {"seeds": seeds, "fixed": list(fixed), "sweeps": list(sweeps)}},
        "tests": tests,
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "madeup.yaml").write_text(yaml.safe_dump(raw))
    return load_claim("madeup", directory)


VAR_TEST = {
    "name": "var",
    "kind": "difference",
    "metric": "var_growth",
    "transform": "log",
    "group": {"arch": "peri_ln"},
    "baseline": {"arch": "pre_ln"},
    "direction": "lower",
    "threshold": 0.405,
}


def test_runs_give_a_verdict_and_stuck_or_diverged_runs_are_named(tmp_path):
    claim = write_claim(tmp_path / "claims", [VAR_TEST])
    runs_dir = tmp_path / "runs"
    for seed, (pre, peri) in enumerate([(40, 10), (44, 11), (36, 9)]):
        fake_run(runs_dir / f"pre{seed}", "pre_ln", seed, var_growth=pre)
        fake_run(runs_dir / f"peri{seed}", "peri_ln", seed, var_growth=peri)
    res = judge_claim(claim, find_runs(runs_dir), "cpu")
    assert res["verdict"] == V.HOLDS
    assert res["tests"][0]["ratio"] == pytest.approx(0.25)
    assert res["groups"]["arch=peri_ln"]["values"] == [10, 11, 9]
    assert set(res) >= {"claim", "verdict", "metric", "effect", "ci", "threshold", "n_seeds", "scale", "groups"}

    # one Pre-LN seed diverges, one Peri-LN seed is stuck: inconclusive, both named
    fake_run(runs_dir / "pre3", "pre_ln", 3, status="diverged", outcome="diverged")
    fake_run(runs_dir / "peri3", "peri_ln", 3, outcome="stuck", var_growth=10)
    res = judge_claim(claim, find_runs(runs_dir), "cpu")
    assert res["verdict"] == V.INCONCLUSIVE
    assert "1 diverged of 4" in res["reason"] and "1 stuck of 4" in res["reason"]
    assert res["groups"]["arch=pre_ln"]["outcomes"] == {"learned": 3, "diverged": 1}


def test_a_side_pooled_over_another_key_counts_each_seed_once(tmp_path):
    """Two norms per (arch, seed) and a test that fixes only the arch: per seed, the norms' values are averaged
    first, so the interval is over 3 seeds (2 dof), paired, not over 6 runs."""
    claim = write_claim(tmp_path / "claims", [{**VAR_TEST, "transform": None, "threshold": 1.0}])
    runs_dir = tmp_path / "runs"
    pre = {
        (0, "layernorm"): 40,
        (0, "rmsnorm"): 42,
        (1, "layernorm"): 44,
        (1, "rmsnorm"): 48,
        (2, "layernorm"): 36,
        (2, "rmsnorm"): 36,
    }
    for (seed, norm), v in pre.items():
        fake_run(runs_dir / f"pre{seed}{norm}", "pre_ln", seed, var_growth=v, extra=(f"norm={norm}",))
        fake_run(runs_dir / f"peri{seed}{norm}", "peri_ln", seed, var_growth=v / 4, extra=(f"norm={norm}",))
    res = judge_claim(claim, find_runs(runs_dir), "cpu")["tests"][0]
    # per seed: pre 41, 46, 36 and peri a quarter of them: differences -30.75, -34.5, -27
    assert res["groups"]["arch=pre_ln"]["values"] == [41, 46, 36] and res["interval"] == "paired"
    diffs = [-30.75, -34.5, -27.0]
    half = 4.302653 * statistics.stdev(diffs) / math.sqrt(3)  # t(0.975, 2 dof)
    assert res["effect"] == pytest.approx(-30.75) and res["n_seeds"] == 3
    assert res["ci"] == pytest.approx([-30.75 - half, -30.75 + half], rel=1e-5)


def test_outcome_claim_counts_diverged_runs(tmp_path):
    test = {
        "name": "trains",
        "kind": "outcome",
        "metric": "learned",
        "group": {"arch": "deepnorm"},
        "baseline": {"arch": "post_ln"},
        "direction": "higher",
        "threshold": 0.5,
    }
    claim = write_claim(tmp_path / "claims", [test], sweeps=({"arch": ["post_ln", "deepnorm"]},))
    for seed in range(3):
        fake_run(tmp_path / "runs" / f"d{seed}", "deepnorm", seed)
        fake_run(tmp_path / "runs" / f"p{seed}", "post_ln", seed, status="diverged", outcome="diverged")
    res = judge_claim(claim, find_runs(tmp_path / "runs"), "cpu")
    assert res["verdict"] == V.HOLDS and res["effect"] == 1.0


def test_a_healthy_run_without_a_value_is_named(tmp_path):
    claim = write_claim(tmp_path / "claims", [VAR_TEST])
    for seed in range(3):
        fake_run(tmp_path / "runs" / f"pre{seed}", "pre_ln", seed, var_growth=40)
        fake_run(tmp_path / "runs" / f"peri{seed}", "peri_ln", seed, var_growth=None if seed == 2 else 10)
    res = judge_claim(claim, find_runs(tmp_path / "runs"), "cpu")
    assert res["verdict"] == V.INCONCLUSIVE and "arch=peri_ln: 1 of 3 runs have no var_growth" in res["reason"]


def test_unfinished_runs_make_it_inconclusive(tmp_path):
    claim = write_claim(tmp_path / "claims", [VAR_TEST])
    for seed in range(3):
        fake_run(tmp_path / "runs" / f"pre{seed}", "pre_ln", seed, var_growth=40)
        fake_run(
            tmp_path / "runs" / f"peri{seed}",
            "peri_ln",
            seed,
            var_growth=10,
            status="interrupted" if seed == 0 else "completed",
        )
    res = judge_claim(claim, find_runs(tmp_path / "runs"), "cpu")
    assert res["verdict"] == V.INCONCLUSIVE and "not finished" in res["reason"]


# ----------------------------------------------------------------------------- registry and CLI


def test_every_contract_claim_is_declared_with_its_scales():
    assert claim_ids() == CONTRACT
    for cid in CONTRACT:
        c = load_claim(cid)
        assert set(c.scales) == {"cpu", "quick", "gpu"} and c.paper and c.tests and c.requires is None, cid
        for scale in ("cpu", "quick", "gpu"):
            assert c.sweep(scale).sweeps and c.sweep(scale).seeds >= 3
        # the verdict trains at least Chinchilla's 20 tokens per parameter; the quick form a fixed step count
        cpu, quick = c.sweep("cpu"), c.sweep("quick")
        per_job = [o for o in cpu.fixed if o.startswith("trainer.tokens_per_param=")]
        assert float(cpu.tokens_per_param or per_job[0].split("=")[1]) >= 20, cid
        assert not any(o.startswith("trainer.max_steps=") for o in cpu.fixed), cid
        assert any(o.startswith("trainer.max_steps=") for o in quick.fixed), cid
        assert cpu.sweeps == quick.sweeps and cpu.seeds == quick.seeds, cid


def test_bad_claim_files_are_one_line(tmp_path):
    with pytest.raises(ConfigError, match="kind=bogus is not one of"):
        write_claim(tmp_path, [{**VAR_TEST, "kind": "bogus"}])
    with pytest.raises(ConfigError, match="metric=loss is not one of"):
        write_claim(tmp_path, [{**VAR_TEST, "metric": "loss"}])
    with pytest.raises(ConfigError, match="unknown claim 'nope'"):
        load_claim("nope")


def test_a_claim_the_code_cannot_measure_says_so_in_one_line(tmp_path):
    from normbench.reproduce.runner import reproduce

    claim = write_claim(tmp_path / "claims", [VAR_TEST])
    claim.requires = "an eval that does not exist yet"
    with pytest.raises(ConfigError, match="cannot run yet: an eval that does not exist yet"):
        reproduce(claim, Request(out=tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_no_run_judges_the_runs_there_are_and_writes_verdict_and_report(tmp_path, monkeypatch):
    from normbench.reproduce import runner

    claim = write_claim(tmp_path / "claims", [VAR_TEST])
    root, _, _ = runner.plan(claim, "cpu", None, [], tmp_path / "out")
    for seed, (pre, peri) in enumerate([(40, 10), (44, 11)]):
        fake_run(root / "sweep0" / f"pre{seed}", "pre_ln", seed, var_growth=pre)
        fake_run(root / "sweep0" / f"peri{seed}", "peri_ln", seed, var_growth=peri)
    fake_run(root / "sweep0" / "peri2", "peri_ln", 2, status="interrupted")
    monkeypatch.setattr(runner, "train", lambda argv: pytest.fail("--no-run trained"))
    res = runner.reproduce(claim, Request(out=tmp_path / "out", launch=False), log=lambda *_: None)
    saved = json.loads((tmp_path / "out" / "madeup" / "verdict.json").read_text())
    assert saved["verdict"] == res["verdict"] == V.INCONCLUSIVE and saved["n_runs"] == 5
    assert "too few seeds: 2 values" in saved["reason"] and "1 of 3 runs not finished" in saved["reason"]
    assert saved["tests"][0]["ratio"] == pytest.approx(0.25)
    report = (tmp_path / "out" / "madeup" / "report.md").read_text()
    assert report.startswith("# Claim madeup: a made-up claim\n\n**Paper**: nobody 2025.\n\n**Verdict: INCONCLUSIVE**")
    mode = saved["mode"]  # the mode the jobs train in, and the CPU it was chosen for (registry.cpu_mode)
    native = cpu_native_bf16()
    assert mode == {
        "precision": "bf16" if native else "fp32",
        "attn_fp32": native,
        "compile": mode["compile"],
        "cpu_mode": "bf16" if native else "fp32",
        "native_bf16": native,
    }
    cpu = "with" if native else "without"
    assert f"**Mode**: {'bf16, attention fp32' if native else 'fp32'}, " in report
    assert f"(the claims' mode on a CPU {cpu} native bf16 products)" in report


def test_runs_outside_the_plan_are_neither_judged_nor_reported(tmp_path, monkeypatch):
    """The sweep directory is named by the settings, not the seeds: after ``seeds=8`` the default 3-seed call
    finds seeds 3-7 there too (and a run left by hand with another arch); its verdict and page hold its 3."""
    from normbench.reproduce import runner

    claim = write_claim(tmp_path / "claims", [VAR_TEST])
    root, _, _ = runner.plan(claim, "cpu", None, [], tmp_path / "out")
    for seed in range(5):  # seeds 3 and 4 would turn the verdict: Peri-LN's growth above Pre-LN's there
        pre, peri = (40, 10) if seed < 3 else (10, 400)
        fake_run(root / "sweep0" / f"pre{seed}", "pre_ln", seed, var_growth=pre)
        fake_run(root / "sweep0" / f"peri{seed}", "peri_ln", seed, var_growth=peri)
    fake_run(root / "sweep0" / "post0", "post_ln", 0, var_growth=1000)
    monkeypatch.setattr(runner, "train", lambda argv: pytest.fail("a finished plan trained"))
    res = runner.reproduce(claim, Request(out=tmp_path / "out"), log=lambda *_: None)
    assert res["n_runs"] == 6 and res["tests"][0]["n_seeds"] == 3
    assert res["verdict"] == V.HOLDS and res["tests"][0]["ratio"] == pytest.approx(0.25)
    runs = json.loads((tmp_path / "out" / "madeup" / "report_runs.json").read_text())
    assert len(runs) == 6 and "post_ln" not in json.dumps(runs)
    assert sorted({str(r["seed"]) for r in runs}) == ["0", "1", "2"]


def test_cli_list_and_errors(capsys):
    from normbench.cli import main

    assert main(["reproduce", "--list"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [ln.split()[0] for ln in lines] == CONTRACT
    assert "arXiv:2502.02732" in next(ln for ln in lines if ln.startswith("peri_variance"))
    assert main(["reproduce", "nope"]) == 2
    assert "unknown claim 'nope'" in capsys.readouterr().err
    assert main(["reproduce", "peri_variance", "scale=tpu"]) == 2
    assert "scale=tpu is not allowed" in capsys.readouterr().err
    assert main(["reproduce", "peri_variance", "seeds=x"]) == 2


def test_dry_run_plans_one_multirun_per_grid(tmp_path, capsys):
    from normbench.cli import main

    assert main(["reproduce", "norm_gain_wd", f"out={tmp_path}", "seeds=4", "--dry-run", "hydra/launcher=basic"]) == 0
    out = capsys.readouterr().out
    assert out.count("normbench train -m") == 2 and "seed=0,1,2,3" in out
    assert "optim.decay_norm_out=false,true" in out and "hydra/launcher=basic" in out
    assert not any(tmp_path.iterdir())


def test_dry_run_names_both_sides_the_runs_a_time_and_a_command_bash_reads_back(tmp_path, capsys):
    """The printed command is the planned argv word for word once bash has parsed it (the
    ``${hydra.job.override_dirname}`` and ``[...]`` words quoted); each side is named with its runs."""
    from normbench.claims.registry import load_claim
    from normbench.cli import main
    from normbench.reproduce.runner import plan

    assert main(["reproduce", "rmsnorm_parity", f"out={tmp_path}", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert (
        "test 'best val loss on par (±0.02 nats)': norm=rmsnorm (3 runs) against norm=layernorm (3 runs), "
        "both from init_std"
    ) in out
    estimate = r"about \d+ (s|min) on this machine's CPU \(estimate; CPU speed calibrated [^)]+ cores\)"
    assert re.search(rf"sweep 0: 6 runs, {estimate}; to run it yourself:", out)
    (line,) = [ln.strip() for ln in out.splitlines() if ln.strip().startswith("python -m normbench train")]
    words = subprocess.run(["bash", "-c", f'printf "%s\\0" {line}'], capture_output=True, text=True, check=True)
    from normbench.reproduce.length import pin
    from normbench.reproduce.plan import build

    claim = load_claim("rmsnorm_parity")
    pinned = build(claim, "cpu", None, [], tmp_path, log=lambda *a: None)  # the length and the mode the call pins
    _, argvs, _ = plan(claim, "cpu", None, pinned.overrides, tmp_path)
    assert pinned.overrides[0] == pin(claim, "cpu").override and argvs == pinned.argvs
    assert words.stdout.split("\0")[:-1] == ["python", "-m", "normbench", "train", *argvs[0]]
    assert "hydra.sweep.subdir=${hydra.job.override_dirname}" in argvs[0]
    assert not any(tmp_path.iterdir())


# ----------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_reproduce_end_to_end_writes_verdict_and_reuses_runs(tmp_path, monkeypatch):
    from normbench.reproduce import runner

    tests = [
        {
            "name": "parity",
            "kind": "on_par",
            "metric": "best_val_loss",
            "group": {"norm": "rmsnorm"},
            "baseline": {"norm": "layernorm"},
            "band": [-0.5, 0.5],
        },
        {
            "name": "skip",
            "kind": "difference",
            "metric": "skip_cost_deep",
            "group": {"norm": "rmsnorm"},
            "baseline": {"norm": "layernorm"},
            "direction": "lower",
            "threshold": 0.01,
            "informative": True,
        },
    ]
    fixed = [
        "model=tiny",
        "trainer.max_steps=8",
        "trainer.eval_every=4",
        "trainer.batch_size=4",
        "trainer.eval_batches=2",
        "diag.every=4",
        "device=cpu",
    ]
    claim = write_claim(tmp_path / "claims", tests, sweeps=({"norm": ["layernorm", "rmsnorm"]},), fixed=fixed, seeds=2)
    out = tmp_path / "out"
    res = runner.reproduce(claim, Request(out=out, min_seeds=2), log=lambda *_: None)
    verdict = json.loads((out / "madeup" / "verdict.json").read_text())
    assert verdict["claim"] == "madeup" and verdict["verdict"] in (V.HOLDS, V.FAILS, V.INCONCLUSIVE)
    for key in ("metric", "effect", "ci", "threshold", "n_seeds", "scale", "groups", "tests", "commit"):
        assert key in verdict, key
    assert verdict["n_seeds"] == 2 and verdict["n_runs"] == 4 and verdict["scale"] == "cpu"
    assert (
        len(verdict["groups"]["norm=rmsnorm"]["values"])
        + verdict["groups"]["norm=rmsnorm"]["outcomes"].get("diverged", 0)
        == 2
    )
    report = (out / "madeup" / "report.md").read_text()
    assert f"**Verdict: {res['verdict']}** at scale=cpu" in report.split("## Tests")[0]
    assert (out / "madeup" / "claim.png").stat().st_size > 1000
    # the layer-skip eval: with every block in place it reproduces the trainer's final val loss
    for run in find_runs(out / "madeup" / "runs"):
        skip = json.loads((run.path / "layer_skip.json").read_text())
        assert len(skip["skipped"]) == 2
        assert math.isclose(skip["base"], run.summary["final_val_loss"], rel_tol=1e-4)

    # a second call trains nothing and gives the same numbers
    monkeypatch.setattr(runner, "train", lambda argv: pytest.fail(f"trained again: {argv}"))
    again = runner.reproduce(claim, Request(out=out, min_seeds=2), log=lambda *_: None)
    assert again["effect"] == res["effect"] and again["verdict"] == res["verdict"]


@pytest.mark.parametrize("cid", ["crmsnorm_parity", "seednorm_gain", "powernorm_gap", "qkclip_logits"])
def test_every_claim_composes_to_a_valid_config(cid):
    """Every grid point of the claims added with the further norms and QK-Clip is a valid training config."""
    import itertools

    from normbench.validation import validate

    from conftest import compose

    claim = load_claim(cid)
    for scale in ("cpu", "gpu"):
        s = claim.sweep(scale)
        for grid in s.sweeps:
            for values in itertools.product(*grid.values()):
                point = [f"{k}={claims.as_str(v)}" for k, v in zip(grid, values)]
                validate(compose([*s.fixed, *point]))


def test_qkclip_claim_on_made_up_runs(tmp_path):
    """attn_logit_peak(_tau): the largest diag attn_logit_max over blocks and steps (/ the run's tau)."""
    claim = load_claim("qkclip_logits")

    def make(clip: bool, seed: int, peaks: list[float], loss: float):
        path = tmp_path / f"{clip}{seed}"
        fake_run(path, "pre_ln", seed, loss=loss, extra=[f"optim.qk_clip={str(clip).lower()}", "optim.qk_clip_tau=10"])
        recs = [{"step": 50 * (i + 1), "loss": 3.0, "attn_logit_max": [p / 2, p]} for i, p in enumerate(peaks)]
        (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))

    for seed in range(3):
        make(False, seed, [8.0, 20.0 + seed, 23.0], 2.0 + 0.01 * seed)
        make(True, seed, [8.0, 10.1, 9.9 + 0.1 * seed], 2.005 + 0.01 * seed)
    res = judge_claim(claim, find_runs(tmp_path), "cpu")
    peak, held, loss = res["tests"]
    assert peak["groups"]["optim.qk_clip=true"]["values"] == [10.1, 10.1, 10.1]
    assert peak["groups"]["optim.qk_clip=false"]["values"] == [23.0, 23.0, 23.0]
    assert held["groups"]["optim.qk_clip=true"]["values"] == pytest.approx([1.01, 1.01, 1.01])
    assert [t["verdict"] for t in res["tests"]] == [V.HOLDS, V.HOLDS, V.HOLDS] and res["verdict"] == V.HOLDS
    make(True, 3, [8.0, 15.0], 2.0)  # a fourth clipped seed over 1.1 tau: the "held" test can no longer hold
    make(False, 3, [8.0, 23.0], 2.0)
    assert judge_claim(claim, find_runs(tmp_path), "cpu")["tests"][1]["verdict"] != V.HOLDS


def test_tuned_test_judges_each_side_at_its_own_best_lr(tmp_path):
    """``tune: optim.lr``: each arch at the LR where all its seeds learned with the lowest mean loss;
    the values left out are still reported with their outcomes."""
    test = {
        "name": "loss",
        "kind": "difference",
        "metric": "best_val_loss",
        "group": {"arch": "ngpt"},
        "baseline": {"arch": "pre_ln"},
        "direction": "lower",
        "threshold": 0.05,
        "tune": "optim.lr",
    }
    claim = write_claim(tmp_path / "claims", [test], sweeps=({"arch": ["pre_ln", "ngpt"], "optim.lr": [1e-3, 1e-2]},))
    runs = tmp_path / "runs"
    for seed in range(3):  # nGPT stuck at 1e-3, best at 1e-2; Pre-LN best at 1e-3, diverges at 1e-2
        fake_run(runs / f"n3{seed}", "ngpt", seed, outcome="stuck", loss=3.8, extra=["optim.lr=1e-3"])
        fake_run(runs / f"n2{seed}", "ngpt", seed, loss=1.9 + 0.01 * seed, extra=["optim.lr=1e-2"])
        fake_run(runs / f"p3{seed}", "pre_ln", seed, loss=2.2 + 0.01 * seed, extra=["optim.lr=1e-3"])
        fake_run(runs / f"p2{seed}", "pre_ln", seed, status="diverged", outcome="diverged", extra=["optim.lr=1e-2"])
    res = judge_claim(claim, find_runs(runs), "cpu")
    t = res["tests"][0]
    assert t["tuned"]["chosen"] == {"arch=ngpt": "0.01", "arch=pre_ln": "0.001"}
    assert t["tuned"]["tried"]["arch=ngpt"] == {"0.001": {"stuck": 3}, "0.01": {"learned": 3}}
    assert res["verdict"] == V.HOLDS and t["effect"] == pytest.approx(-0.3)
    assert t["groups"]["arch=ngpt"]["values"] == pytest.approx([1.9, 1.91, 1.92])
    assert "each side at its own best optim.lr" in " ".join(claim_summary.test_lines(res)).lower()

    # without tuning the stuck and diverged runs keep the same test from a verdict
    untuned = write_claim(tmp_path / "c2", [{**test, "tune": None}], sweeps=({"arch": ["pre_ln", "ngpt"]},))
    assert judge_claim(untuned, find_runs(runs), "cpu")["verdict"] == V.INCONCLUSIVE

    # a side where no LR learned with every seed: inconclusive, said so
    for seed in range(3):
        (runs / f"n2{seed}" / "summary.json").unlink()
        fake_run(runs / f"n2{seed}x", "ngpt", seed, outcome="stuck", loss=3.5, extra=["optim.lr=1e-2"])
        shutil.rmtree(runs / f"n2{seed}")
    res = judge_claim(claim, find_runs(runs), "cpu")
    assert res["verdict"] == V.INCONCLUSIVE and "arch=ngpt: no optim.lr of the grid learned" in res["reason"]


def test_swept_booleans_select_in_any_spelling(tmp_path):
    """Hydra's sweeper writes a swept boolean as ``False``; the claim file says ``false``."""
    test = {
        "name": "wd",
        "kind": "difference",
        "metric": "best_val_loss",
        "group": {"optim.decay_norm_out": True},
        "baseline": {"optim.decay_norm_out": False},
        "direction": "higher",
        "threshold": 0.01,
    }
    claim = write_claim(tmp_path / "claims", [test], sweeps=({"optim.decay_norm_out": [False, True]},))
    for seed in range(3):
        fake_run(
            tmp_path / "runs" / f"on{seed}",
            "peri_ln",
            seed,
            loss=2.5 + 0.01 * seed,
            extra=["optim.decay_norm_out=True"],
        )
        fake_run(
            tmp_path / "runs" / f"off{seed}",
            "peri_ln",
            seed,
            loss=2.3 + 0.01 * seed,
            extra=["optim.decay_norm_out=False"],
        )
    res = judge_claim(claim, find_runs(tmp_path / "runs"), "cpu")
    assert res["verdict"] == V.HOLDS and res["effect"] == pytest.approx(0.2)
    assert res["groups"]["optim.decay_norm_out=true"]["values"] == pytest.approx([2.5, 2.51, 2.52])


def test_largest_lr_on_runs_counts_seeds_per_lr_and_draws_the_grid(tmp_path):
    test = {
        "name": "lr",
        "kind": "largest_lr",
        "metric": "learned",
        "group": {"arch": "peri_ln"},
        "baseline": {"arch": "pre_ln"},
        "direction": "higher",
        "threshold": 1,
    }
    claim = write_claim(
        tmp_path / "claims", [test], sweeps=({"arch": ["pre_ln", "peri_ln"], "optim.lr": [3e-3, 1e-2]},)
    )
    for seed in range(3):  # Peri-LN learns at both LRs; one Pre-LN seed is stuck at 1e-2
        for lr in ("3e-3", "1e-2"):
            fake_run(tmp_path / "runs" / f"peri{lr}{seed}", "peri_ln", seed, extra=[f"optim.lr={lr}"])
            stuck = lr == "1e-2" and seed == 1
            fake_run(
                tmp_path / "runs" / f"pre{lr}{seed}",
                "pre_ln",
                seed,
                outcome="stuck" if stuck else "learned",
                extra=[f"optim.lr={lr}"],
            )
    runs = find_runs(tmp_path / "runs")
    res = judge_claim(claim, runs, "cpu")
    assert res["verdict"] == V.HOLDS and res["effect"] == 1 and res["n_seeds"] == 3
    assert res["tests"][0]["largest_lr"] == {"arch=peri_ln": 0.01, "arch=pre_ln": 0.003}
    share = res["tests"][0]["learned_share"]
    assert share == {"arch=peri_ln": {0.003: 1.0, 0.01: 1.0}, "arch=pre_ln": {0.003: 1.0, 0.01: pytest.approx(2 / 3)}}
    from normbench.claims.figure import plot_claim

    png = plot_claim(res, runs, claim, tmp_path / "claim.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


PARITY = {
    "name": "loss on par",
    "kind": "on_par",
    "metric": "best_val_loss",
    "group": {"norm": "rmsnorm"},
    "baseline": {"norm": "layernorm"},
    "band": [-0.02, 0.02],
}
GROWTH = {**VAR_TEST, "name": "variance growth", "group": {"norm": "rmsnorm"}, "baseline": {"norm": "layernorm"}}


def test_the_claim_page_reads_like_its_report(tmp_path):
    """Claim and paper first, the verdict naming the test it comes from (not the first test, which holds),
    every effect RMSNorm − LayerNorm (the report's default baseline would be RMSNorm), numbers at their
    interval's precision, the figure in three formats with words on its axes and no text under 7 pt."""
    from normbench.claims.summary import verdict_line
    from normbench.reproduce import runner

    claim = write_claim(tmp_path / "claims", [PARITY, GROWTH], sweeps=({"norm": ["layernorm", "rmsnorm"]},))
    root, _, _ = runner.plan(claim, "cpu", None, [], tmp_path / "out")
    # loss: RMSNorm - LayerNorm = +0.004, +0.002, +0.010 by seed; variance growth: one seed goes the other way
    for seed, (ln, rms, v_ln, v_rms) in enumerate([(2.0, 2.004, 40, 30), (2.05, 2.052, 44, 45), (1.98, 1.99, 36, 20)]):
        fake_run(root / "sweep0" / f"ln{seed}", "pre_ln", seed, loss=ln, var_growth=v_ln, extra=["norm=layernorm"])
        fake_run(root / "sweep0" / f"rms{seed}", "pre_ln", seed, loss=rms, var_growth=v_rms, extra=["norm=rmsnorm"])
    res = runner.reproduce(claim, Request(out=tmp_path / "out", launch=False), log=lambda *_: None)
    assert [t["verdict"] for t in res["tests"]] == [V.HOLDS, V.INCONCLUSIVE] and res["verdict"] == V.INCONCLUSIVE
    line = verdict_line(res)
    assert line.startswith("madeup: INCONCLUSIVE at scale=cpu, decided by variance growth: INCONCLUSIVE")
    assert "loss on par" not in line and "RMSNorm − LayerNorm" in line
    page_dir = tmp_path / "out" / "madeup"
    md = (page_dir / "report.md").read_text()
    top, rest = md.split("## Tests")
    assert top.index("**Paper**: nobody 2025") < top.index("**Verdict: INCONCLUSIVE**") < top.index("](claim.png)")
    assert "decided by “variance growth”" in top and "loss on par" not in top
    # the paired loss differences by hand: mean 0.005333, sd 0.004163, t(2) 4.303: half-width 0.0103 -> 3 places
    assert "RMSNorm − LayerNorm: +0.005 [-0.005, +0.016] (paired, over 3 seeds)" in rest
    assert "; 3 seeds (variance growth: " in line and "Protocol changed" not in top  # the claim's own protocol
    assert "| norm | rmsnorm − layernorm | +0.005 [-0.005, +0.016] |" in rest  # the report's box: the same sign
    assert "layernorm − rmsnorm" not in md
    assert f"commit `{res['commit']}`" in rest and "6 runs" in rest
    page = (page_dir / "report.html").read_text()
    assert "**" not in page and "<strong>Verdict: INCONCLUSIVE</strong>" in page
    assert "<title>Claim madeup: a made-up claim</title>" in page
    assert re.search(
        r'<img alt="the claim&#x27;s tests: each side&#x27;s values by seed[^"]*best validation loss', page
    )
    assert (page_dir / "claim.pdf").read_bytes().startswith(b"%PDF")
    svg = (page_dir / "claim.svg").read_text()
    sizes = [float(x) for x in re.findall(r"font-size:\s*([\d.]+)px", svg)]
    assert sizes and min(sizes) >= 7.0
    assert "best validation loss (nats/token)" in svg and "LayerNorm" in svg and "band of no meaningful" in svg
    assert "best_val_loss" not in svg and "norm=rmsnorm" not in svg


def test_the_claim_page_says_what_an_interval_is_over_and_when_the_protocol_was_changed():
    """A timing test decided by the paired benchmark: its interval is over rounds at a recorded load, not seeds;
    a command that changed the claim's protocol (overrides, seeds, a scale other than cpu) is said on the page."""
    from normbench.claims.summary import deciding_over, protocol_text

    bench = {
        "plan": {"rounds": 5, "steps": 10},
        "load": {"loadavg_before": [3.14, 2, 1], "loadavg_after": [3.4, 3, 2], "cpu_count": 2},
    }
    timing = {"name": "speed", "verdict": V.FAILS, "benchmark": bench}
    res = {"n_seeds": 3, "verdict": V.FAILS, "tests": [timing], "scale": "cpu"}
    assert (
        deciding_over(res) == "5 paired benchmark rounds of 10 steps per side at load 3.1 → 3.4 on 2 cores, not seeds"
    )
    assert deciding_over({**res, "tests": [{"name": "loss", "verdict": V.FAILS}]}) == "3 seeds"
    assert protocol_text({**res, "protocol": {"overrides": [], "seeds": None, "declared_seeds": 3}}) is None
    changed = protocol_text(
        {**res, "protocol": {"overrides": ["trainer.max_steps=50"], "seeds": 2, "declared_seeds": 3}}
    )
    assert changed == (
        "**Protocol changed**: the command changed the claim's protocol: `trainer.max_steps=50`, `seeds=2` (the claim "
        "declares 3). Read this verdict as one of these runs, not of the claim."
    )
    quick = protocol_text({**res, "scale": "quick", "protocol": {"overrides": [], "seeds": None, "declared_seeds": 3}})
    assert quick.startswith("**Protocol changed**: scale=quick is not the verdict's protocol") and "smoke test" in quick


# ----------------------------------------------------------------------------- the plan (reproduce/plan.py)


def test_a_dry_run_composes_each_job_once(tmp_path, capsys, monkeypatch):
    """One ``reproduce --dry-run``: every job composed once, through the length and compile pins, the shared
    check, the sides' run counts and the estimate (before the plan: three compositions per job)."""
    from normbench.cli import main
    from normbench.reproduce import shared

    calls = []
    real = shared.compose
    monkeypatch.setattr(shared, "compose", lambda *a: calls.append(a[2]) or real(*a))
    assert main(["reproduce", "ngpt_speed", "compile=auto", f"out={tmp_path}", "--dry-run"]) == 0
    out = capsys.readouterr().out
    claim = load_claim("ngpt_speed")
    n_jobs = sum(math.prod(len(v) for v in grid.values()) for grid in claim.sweep("cpu").sweeps)
    assert len(calls) == n_jobs == len({json.dumps(c, sort_keys=True) for c in calls})
    assert "tokens per parameter of the baseline" in out and "for every job" in out  # both pins ran
    assert out.count("normbench train -m") == len(claim.sweep("cpu").sweeps)


def test_the_dry_run_estimate_is_the_plans_configs_timed(tmp_path, monkeypatch):
    """The estimate of a sweep: each composed job's seconds (estimate.job_seconds) once per seed, plus the
    sweep's start-up, from the plan's own configs."""
    from normbench.reproduce import dryrun, estimate
    from normbench.reproduce.plan import build
    from normbench.validation import to_config

    monkeypatch.setattr(estimate, "cpu_rate", lambda: 4.5e10)
    p = build(load_claim("rmsnorm_parity"), "cpu", None, [], tmp_path, log=lambda _: None)
    cfgs = [j.cfg for j in p.sweep_jobs(0)]
    text, seconds = dryrun.sweep_estimate(cfgs, 6)
    by_hand = sum(estimate.job_seconds(to_config(c))[0] for c in cfgs) * 3 + estimate.SWEEP_START_S
    assert seconds == pytest.approx(by_hand) and "on this machine's CPU (estimate" in text
    assert {c.trainer.max_steps for c in cfgs} == {p.pinned.steps}  # the pinned length is what is timed


def test_the_plans_run_dirs_are_hydras(tmp_path):
    """Plan.run_dir is the directory Hydra's sweep gives a job: its override_dirname of the swept keys, as
    the sweeper spells the values (1e-3 -> 0.001, false -> False), the fixed and bookkeeping keys left out."""
    from hydra._internal.config_loader_impl import get_overrides_dirname
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from normbench.reproduce.plan import Plan, layout

    sweeps = ({"arch": ["pre_ln", "peri_ln"], "optim.lr": [1e-3, 3e-3], "optim.decay_norm_out": [False]},)
    claim = write_claim(tmp_path / "claims", [VAR_TEST], sweeps=sweeps)
    p = Plan(claim, "cpu", 2, ["trainer.log_every=5"], tmp_path)
    root, argvs, expected = layout(claim, "cpu", 2, p.overrides, tmp_path)
    (exclude,) = [a.split("=[", 1)[1].rstrip("]").split(",") for a in argvs[0] if a.startswith("hydra.job.config")]
    parser = OverridesParser.create()
    (batch,) = BasicSweeper.split_arguments(parser.parse_overrides([a for a in argvs[0][1:] if "hydra" not in a]), None)
    hydras = {root / "sweep0" / get_overrides_dirname(parser.parse_overrides(job), exclude, ",", "=") for job in batch}
    assert {p.run_dir(run, 0) for run in expected[0]} == hydras and len(hydras) == 8
    assert p.run_dir(expected[0][0], 0).name == "arch=pre_ln,optim.decay_norm_out=False,optim.lr=0.001,seed=0"


@pytest.mark.slow
def test_jobs_2_runs_a_sweep_two_at_a_time_with_one_thread_each_and_reuses_it(tmp_path, monkeypatch, capsys):
    """``jobs=2``: each sweep through Hydra's joblib launcher, two jobs at once, each with OMP_NUM_THREADS=1;
    the runs land where the basic launcher puts them, so a second call (any launcher) reuses them."""
    from normbench.reproduce import runner
    from normbench.reproduce.plan import threads_env

    fixed = [
        "model=tiny",
        "trainer.max_steps=6",
        "trainer.eval_every=3",
        "trainer.batch_size=4",
        "trainer.eval_batches=2",
        "diag=off",
        "device=cpu",
    ]
    test = {
        "name": "parity",
        "kind": "on_par",
        "metric": "best_val_loss",
        "group": {"norm": "rmsnorm"},
        "baseline": {"norm": "layernorm"},
        "band": [-0.5, 0.5],
    }
    claim = write_claim(tmp_path / "claims", [test], sweeps=({"norm": ["layernorm", "rmsnorm"]},), fixed=fixed, seeds=2)
    envs, call = [], subprocess.call
    monkeypatch.setattr(runner.subprocess, "call", lambda cmd, env: envs.append(env) or call(cmd, env=env))
    req = parse(["madeup", "jobs=2", f"out={tmp_path / 'out'}", "min_seeds=2"])
    assert req.jobs == 2 and req.overrides == ("hydra/launcher=joblib", "hydra.launcher.n_jobs=2")
    res = runner.reproduce(claim, req, log=lambda *_: None)
    assert [e["OMP_NUM_THREADS"] for e in envs] == ["1"] and threads_env(["hydra.launcher.n_jobs=1"]) == {}
    runs = find_runs(tmp_path / "out" / "madeup" / "runs")
    assert len(runs) == 4 and {r.status for r in runs} == {"completed"} and res["n_runs"] == 4
    monkeypatch.setattr(runner, "train", lambda argv: pytest.fail(f"trained again: {argv}"))
    again = runner.reproduce(claim, Request(out=tmp_path / "out", min_seeds=2), log=lambda *_: None)
    assert again["effect"] == res["effect"] and again["runs_dir"] == res["runs_dir"]


def test_jobs_option_is_checked(capsys):
    from normbench.cli import main

    assert main(["reproduce", "peri_variance", "jobs=0", "--dry-run"]) == 2
    assert "jobs=0 must be a whole number" in capsys.readouterr().err
    assert main(["reproduce", "peri_variance", "jobs=2", "hydra/launcher=slurm", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "jobs=2 runs the sweeps through hydra/launcher=joblib; drop hydra/launcher=slurm" in err
    assert main(["reproduce", "peri_variance", "jobs=2", "out=/nonexistent/x", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 python -m normbench train -m" in out
    assert "hydra/launcher=joblib hydra.launcher.n_jobs=2" in out


def test_the_claim_figure_draws_the_deciding_interval_and_a_band_that_does_not_fill_the_axis():
    """An INCONCLUSIVE on-par test: the effect's interval leaves the ±0.02 band, and the figure shows it (issue
    52: the band covered the whole axis, so such a test looked on par, and the interval was not drawn)."""
    from matplotlib.figure import Figure

    from normbench.claims import figure
    from normbench.report.figures import set_log

    t = {
        "name": "on par",
        "kind": "on_par",
        "metric": "best_val_loss",
        "interval": "paired",
        "transform": None,
        "threshold": [-0.02, 0.02],
        "effect": 0.006,
        "ci": [-0.0135, 0.0258],
        "groups": {
            "norm=rmsnorm": {"values": [1.271, 1.262, 1.285], "outcomes": {"learned": 3}},
            "norm=layernorm": {"values": [1.270, 1.260, 1.270], "outcomes": {"learned": 3}},
        },
    }
    ax = Figure().subplots()
    figure._plot_sides(ax, t, None, set_log, {"norm=rmsnorm": "tab:orange", "norm=layernorm": "tab:blue"})
    ref = statistics.fmean([1.270, 1.260, 1.270])
    (bar,) = [c for c in ax.containers if hasattr(c, "has_yerr")]  # the errorbar: the effect and its interval
    ((x, y),) = bar.lines[0].get_xydata()
    assert y == pytest.approx(ref + 0.006) and x > 1
    lo, hi = ax.get_ylim()
    assert lo <= ref - 0.0135 and hi >= ref + 0.0258  # the whole interval is on the axis ...
    (band,) = ax.patches  # axhspan's rectangle: from ref - 0.02 to ref + 0.02
    y0, y1 = band.get_y(), band.get_y() + band.get_height()
    assert (y0, y1) == (pytest.approx(ref - 0.02), pytest.approx(ref + 0.02))
    assert hi > y1  # ... and pokes out of the band, which no longer fills it
    colors = [tuple(c.get_facecolor()[0][:3]) for c in ax.collections if c.get_offsets().shape[0] == 3]
    from matplotlib.colors import to_rgb

    assert colors == [to_rgb("tab:blue"), to_rgb("tab:orange")]  # baseline left, group right, the report's colours
    welch = {**t, "interval": "welch"}
    text = figure.caption({"tests": [welch]}, "`claim.pdf`")
    assert "grey line" not in text and "95% interval" in text and "band of no meaningful effect" in text
    assert "grey line" in figure.caption({"tests": [t]}, "`claim.pdf`")


def test_usage_names_each_option_with_its_default_from_the_request():
    """The help text's defaults are written from :class:`Request`'s fields, their one home: each option is
    named with its default (or as the claim's own), and min_seeds' default is the verdict rule's."""
    from normbench.reproduce import USAGE
    from normbench.reproduce.request import OPTIONS, spelled_default

    defaults = USAGE.split("defaults:")[1]
    for key in OPTIONS:
        value = spelled_default(key)
        assert f"[{key}=" in USAGE.split("\n\n")[0], key  # in the synopsis
        assert (f"{key}={value}" if value is not None else f"{key}=") in " ".join(defaults.split()), key
    assert Request().min_seeds == V.MIN_SEEDS and spelled_default("min_seeds") == str(V.MIN_SEEDS)
    assert spelled_default("duration") == "false" and spelled_default("bench") == "5x10"


def test_the_request_is_parsed_once_into_typed_options():
    req = parse(["peri_variance", "seeds=4", "min_seeds=2", "duration=branch", "rungs=5,1", "bench=off", "--no-run"])
    assert req.ids == ("peri_variance",) and req.seeds == 4 and req.min_seeds == 2 and req.rungs == (5.0, 1.0)
    assert req.duration == "branch" and req.kind == "duration" and req.bench is None and not req.launch
    assert parse(["x", "ladder=true"]).kind == "ladder" and parse(["x", "lr=ladder"]).kind == "lr"
    assert parse(["x"]) == Request(ids=("x",)) and Request().kind is None
    rung = parse(["x", "norm=rmsnorm", "out=o"]).rung(["optim.lr=1e-3"], "o/x/lr")
    assert rung.overrides == ("norm=rmsnorm", "optim.lr=1e-3") and str(rung.out) == "o/x/lr"
