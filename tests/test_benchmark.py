"""A claim's timing tests from reproduce's paired benchmark (claims/benchmark.py): the rounds, the ratio and
its interval by hand, verdict.json's record, the test left informative without a benchmark."""

from __future__ import annotations

import json
import math
import os

import pytest

from normbench.claims import benchmark as B
from normbench.claims import verdict as V
from normbench.errors import ConfigError
from normbench.reproduce.request import Request
from test_reproduce import fake_run, write_claim

# per-round seconds per step: the group is 1.25, 10/9 and 1.2 times faster, a geometric mean of (5/3)^(1/3)
GROUP_S, BASE_S = [0.08, 0.09, 0.10], [0.10, 0.10, 0.12]
RATIO = (5 / 3) ** (1 / 3)
LOG_CI = [0.0217029, 0.3188476]  # mean 0.170275 ± t(0.975, 2) 4.3027 x sd 0.0598084 / sqrt(3)

THROUGHPUT = {
    "name": "throughput",
    "kind": "difference",
    "metric": "tokens_per_s",
    "transform": "log",
    "group": {"norm": "rmsnorm"},
    "baseline": {"norm": "layernorm"},
    "direction": "higher",
    "threshold": 0.01,
}
PARITY = {
    "name": "parity",
    "kind": "on_par",
    "metric": "best_val_loss",
    "group": {"norm": "rmsnorm"},
    "baseline": {"norm": "layernorm"},
    "band": [-0.5, 0.5],
}


def test_plan_parses_and_bad_values_name_the_key():
    assert B.parse_plan(None) == B.Plan(5, 10, 3) and B.parse_plan("4x2") == B.Plan(4, 2)
    assert B.parse_plan("off") is None
    for bad in ("2x10", "5", "ax3", "5x0"):
        with pytest.raises(ConfigError, match=f"bench={bad} is not allowed"):
            B.parse_plan(bad)


def test_rounds_interleave_the_sides_after_the_warmup():
    calls = []
    steps = {"group": lambda: calls.append("g"), "baseline": lambda: calls.append("b")}
    times = B.interleave(steps, B.Plan(rounds=3, steps=2, warmup=1))
    assert "".join(calls) == "gb" + "ggbb" + "bbgg" + "ggbb"
    assert [len(v) for v in times.values()] == [3, 3] and all(t >= 0 for v in times.values() for t in v)


def test_ratio_and_interval_over_rounds_by_hand():
    res = B.summarize({"group": GROUP_S, "baseline": BASE_S}, tokens_per_step=1024)
    assert res["ratio"] == pytest.approx(RATIO)
    assert res["ratio_ci"] == pytest.approx([math.exp(x) for x in LOG_CI], rel=1e-5)
    assert res["median_seconds_per_step"] == {"group": 0.09, "baseline": 0.10}


def _claim_with_runs(tmp_path, tests):
    from normbench.reproduce import runner

    claim = write_claim(tmp_path / "claims", tests, sweeps=({"norm": ["layernorm", "rmsnorm"]},))
    root, _, _ = runner.plan(claim, "cpu", None, [], tmp_path / "out")
    for seed in range(3):
        for norm, loss in (("layernorm", 2.0 + 0.01 * seed), ("rmsnorm", 2.01 + 0.01 * seed)):
            fake_run(root / "sweep0" / f"{norm}{seed}", "pre_ln", seed, loss=loss, extra=[f"norm={norm}"])
    return claim, runner


def _fake_measure(monkeypatch, calls):
    monkeypatch.setattr(B, "_config", lambda run: run.path.name)  # the fake runs have no composed config

    def measure(cfg_g, cfg_b, plan):
        calls.append((cfg_g, cfg_b, plan))
        res = B.summarize({"group": GROUP_S, "baseline": BASE_S}, tokens_per_step=1024)
        return {**res, "plan": {"rounds": plan.rounds}, "load": {"loadavg_before": [9.0, 8.0, 7.0], "cpu_count": 2}}

    monkeypatch.setattr(B, "measure", measure)


def test_throughput_is_judged_from_the_benchmark_and_recorded_in_verdict_json(tmp_path, monkeypatch):
    claim, runner = _claim_with_runs(tmp_path, [PARITY, THROUGHPUT])
    calls = []
    _fake_measure(monkeypatch, calls)
    monkeypatch.setattr(runner, "train", lambda argv: pytest.fail("the runs are there: nothing to train"))
    runner.reproduce(claim, Request(out=tmp_path / "out", bench=B.Plan(3, 4)), log=lambda *_: None)
    saved = json.loads((tmp_path / "out" / "madeup" / "verdict.json").read_text())
    test = saved["tests"][1]
    assert calls == [("rmsnorm0", "layernorm0", B.Plan(3, 4))]  # the sides' first runs, the plan asked for
    assert test["timing"] == "paired benchmark" and test["interval"] == "paired over benchmark rounds"
    assert test["benchmark"]["ratio"] == pytest.approx(RATIO) and test["ratio"] == pytest.approx(RATIO)
    assert test["effect"] == pytest.approx(math.log(RATIO)) and test["ci"] == pytest.approx(LOG_CI, rel=1e-5)
    assert test["benchmark"]["load"]["loadavg_before"] == [9.0, 8.0, 7.0]
    assert test["verdict"] == V.HOLDS and not test["informative"] and saved["verdict"] == V.HOLDS
    assert test["groups"]["norm=rmsnorm"]["values"] == pytest.approx([1024 / s for s in GROUP_S])


@pytest.mark.parametrize("how", ["no-run", "off"])
def test_without_a_benchmark_the_timing_test_is_informative_with_the_reason(tmp_path, monkeypatch, how):
    claim, runner = _claim_with_runs(tmp_path, [PARITY, THROUGHPUT])
    _fake_measure(monkeypatch, fail := [])
    req = Request(out=tmp_path / "out", launch=how != "no-run", bench=None if how == "off" else Request.bench)
    res = runner.reproduce(claim, req, log=lambda *_: None)
    test = res["tests"][1]
    assert not fail and test["informative"] and test["verdict"] == V.INCONCLUSIVE
    assert (
        test["timing"] == "runs' wall clocks"
        and f"({'--no-run' if how == 'no-run' else 'bench=off'})" in test["reason"]
    )
    assert res["verdict"] == res["tests"][0]["verdict"] == V.HOLDS  # the loss test alone decides
    report = (tmp_path / "out" / "madeup" / "report.md").read_text()
    assert "not judged: no paired benchmark ran" in report


def test_seconds_to_target_are_the_runs_steps_times_the_benchmarks_seconds_per_step(tmp_path, monkeypatch):
    """Steps to the target 2.0 (val losses 3.0 -> 1.0 between steps 0 and the run's 2 x steps: the crossing
    half-way) times each side's median seconds per step in the benchmark (0.09 and 0.10)."""
    test = {**THROUGHPUT, "name": "seconds", "metric": "seconds_to_target", "direction": "lower", "target": 2.0}
    claim, runner = _claim_with_runs(tmp_path, [PARITY, test])
    steps = {"rmsnorm": [80, 84, 88], "layernorm": [100, 100, 110]}
    for path in (tmp_path / "out").rglob("summary.json"):
        norm, seed = path.parent.name[:-1], int(path.parent.name[-1])
        end = 2 * steps[norm][seed]
        rows = [{"step": 0, "val_loss": 3.0, "time_s": 0.0}, {"step": end, "val_loss": 1.0, "time_s": 99.0}]
        (path.parent / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    _fake_measure(monkeypatch, [])
    res = runner.reproduce(claim, Request(out=tmp_path / "out"), log=lambda *_: None)
    t = res["tests"][1]
    assert t["timing"] == "paired benchmark" and t["interval"] == "paired"  # over the seeds
    assert t["groups"]["norm=rmsnorm"]["values"] == pytest.approx([s * 0.09 for s in steps["rmsnorm"]])
    assert t["groups"]["norm=layernorm"]["values"] == pytest.approx([s * 0.10 for s in steps["layernorm"]])


def test_a_real_benchmark_of_two_tiny_models_records_its_rounds_and_the_load():
    from normbench.config.files import compose_config
    from normbench.validation import to_config

    cfgs = [
        to_config(compose_config(["model=tiny", "model.n_layer=1", f"norm={n}", "trainer.batch_size=2", "device=cpu"]))
        for n in ("rmsnorm", "layernorm")
    ]
    res = B.measure(*cfgs, B.Plan(rounds=3, steps=1, warmup=1))
    assert [len(v) for v in res["seconds_per_step"].values()] == [3, 3]
    assert res["tokens_per_step"] == 2 * cfgs[0].model.seq_len and res["device"] == "cpu" and not res["compile"]
    load = res["load"]
    assert load["cpu_count"] == os.cpu_count() and len(load["loadavg_before"]) == 3 and load["torch_threads"] >= 1
    assert res["ratio_ci"][0] <= res["ratio"] <= res["ratio_ci"][1]


def test_loaded_spread_needs_equal_flops_and_a_spread_past_20_percent():
    from normbench.analysis.loading import Run
    from normbench.report.tables import loaded_spread

    runs = lambda *pairs: [Run(None, {}, [], {"flops_per_token": f, "tokens_per_s": t}, []) for f, t in pairs]
    assert loaded_spread(runs((1e6, 1000), (1.01e6, 1210))) == (1000, 1210)  # FLOPs within 2%, tokens/s 21% apart
    assert loaded_spread(runs((1e6, 1000), (1e6, 1200))) is None  # 20% exactly: not flagged
    assert loaded_spread(runs((1e6, 1000), (1.03e6, 2000))) is None  # different work per token
    assert loaded_spread(runs((1e6, 1000))) is None


@pytest.mark.slow
def test_a_report_flags_tokens_per_s_and_seconds_measured_on_a_loaded_machine(tmp_path):
    """Three seeds of one shape whose tokens/s range 1,000-2,100 (the machine's load, not the model) are
    flagged in the main table and the target table; so is a group within 20% that ran beside them in the
    same sweep (the load is the machine's, not the group's), each with its own range; a sweep without such
    a spread is not flagged."""
    from normbench import report
    from test_report import config, fake_records, make_run, summary_for, table

    root = tmp_path / "sweep"
    speeds = {"pre_ln": [1000.0, 1500.0, 2100.0], "peri_ln": [1000.0, 1050.0, 1100.0]}
    for arch, tps in speeds.items():
        for seed in range(3):
            recs = fake_records(1.0 + 0.01 * seed)
            s = {**summary_for(recs, arch, seed), "tokens_per_s": tps[seed], "flops_per_token": 1.5e6}
            make_run(root / f"{arch}{seed}", [f"arch={arch}", f"seed={seed}"], config(arch, seed), recs, s)
    md = report.make_report(root).read_text()
    rows = table(md, "group")
    assert rows["arch=pre_ln"]["tokens/s"] == "1,533 (1,000-2,100: measured on a loaded machine)"
    assert rows["arch=peri_ln"]["tokens/s"] == "1,050 (1,000-1,100: measured on a loaded machine)"
    seconds = table(md[md.index("| group | outcomes | target |") :], "group")
    assert seconds["arch=pre_ln"]["seconds"] == "9.86 ± 0.14 (measured on a loaded machine)"
    assert seconds["arch=peri_ln"]["seconds"] == "9.86 ± 0.14 (measured on a loaded machine)"
    assert [r["loaded"] for r in json.loads((root / "report_groups.json").read_text())] == [True, True]

    quiet = tmp_path / "quiet"  # the same sweep with pre_ln's seeds within 20% too: nothing flagged
    for arch in speeds:
        for seed in range(3):
            recs = fake_records(1.0 + 0.01 * seed)
            s = {**summary_for(recs, arch, seed), "tokens_per_s": 1000.0 + 50 * seed, "flops_per_token": 1.5e6}
            make_run(quiet / f"{arch}{seed}", [f"arch={arch}", f"seed={seed}"], config(arch, seed), recs, s)
    rows = table(report.make_report(quiet).read_text(), "group")
    assert rows["arch=pre_ln"]["tokens/s"] == rows["arch=peri_ln"]["tokens/s"] == "1,050"
