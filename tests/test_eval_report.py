"""Downstream scores (eval.json) in the report: a table per task with the seed as the unit of every interval,
``--metric TASK/METRIC`` for the verdict box (higher is better for an accuracy), on made-up runs."""

from __future__ import annotations

import json
import statistics

import pytest
from scipy.stats import t

from normbench import report
from normbench.report import downstream
from normbench.run.eval_file import write_eval
from test_report_answer import box_table, make_sweep

SEEDS = (0, 1, 2)
ACC = {"pre_ln": 0.40, "post_ln": 0.50}
SEED_SHIFT = [0.0, 0.03, -0.02]  # shared by both archs at a seed
NORM_SHIFT = {"layernorm": 0.01, "rmsnorm": -0.01}


def acc(arch: str, norm: str, seed: int) -> float:
    return ACC[arch] + SEED_SHIFT[seed] + NORM_SHIFT[norm] + 0.002 * seed * (arch == "post_ln")


def scored_sweep(root):
    make_sweep(root, archs=tuple(ACC), seeds=SEEDS)
    for run in sorted(root.iterdir()):
        arch, norm, seed = (part.split("=")[1] for part in run.name.split("_", 1)[1].split(","))
        task = {
            "metrics": {"acc": {"value": acc(arch, norm, int(seed)), "stderr": 0.01}},
            "n": 100,
            "higher_is_better": {"acc": True},
            "config_hash": "abc",
            "limit": None,
        }
        write_eval(run, "0.4.13", 150, {"arc_easy": task})
    return root


def test_a_level_is_shown_at_its_interval_precision():
    assert downstream.level(0.41234, 0.39, 0.43) == "0.412 [0.390, 0.430]"  # half-width 0.02: two figures
    assert downstream.level(0.5, 0.5, 0.5) == "0.5000 [0.5000, 0.5000]"


def test_downstream_table_and_verdict_with_the_seed_as_the_unit(tmp_path, capsys):
    root = scored_sweep(tmp_path / "sweep")
    assert report.main([str(root), "--no-figures", "--group-by", "arch", "--metric", "arc_easy/acc"]) == 0
    md = (root / "report.md").read_text()
    assert "## Downstream" in md and "### arc_easy" in md
    rows = {r[0]: r for r in box_table(md.split("### arc_easy")[1], "group")}
    for arch in ACC:
        # per seed the mean over the two norms (one unit), then the t-interval over the 3 seeds
        per_seed = [statistics.fmean(acc(arch, n, s) for n in NORM_SHIFT) for s in SEEDS]
        mean, sd = statistics.fmean(per_seed), statistics.stdev(per_seed)
        half = t.ppf(0.975, 2) * sd / 3**0.5
        assert rows[f"arch={arch}"][1:] == [
            f"{downstream.level(mean, mean - half, mean + half)} (3 seeds)",
            "100",
            "150",
        ]
    box = {r[1]: r for r in box_table(md, "factor")}
    assert "Effect on the **arc_easy/acc** (higher is better)" in md
    assert box["post_ln − pre_ln"][3] == "post_ln better (higher)"  # +0.10 at every seed: paired over 3 seeds
    assert "arc_easy/acc [95% CI, this comparison alone] |" in md  # an accuracy has no unit


def test_a_downstream_metric_no_run_has_is_one_line(tmp_path, capsys):
    root = scored_sweep(tmp_path / "sweep")
    assert report.main([str(root), "--no-figures", "--metric", "arc_easy/acc_norm"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "normbench: error: --metric arc_easy/acc_norm: no run has it (the runs have: arc_easy/acc; "
        "score them with python -m normbench eval)"
    ]


def test_no_eval_json_no_downstream_section(tmp_path):
    root = make_sweep(tmp_path / "sweep", archs=("pre_ln",), seeds=(0, 1))
    assert report.main([str(root), "--no-figures"]) == 0
    assert "Downstream" not in (root / "report.md").read_text()


def test_a_claim_test_may_name_a_downstream_metric(tmp_path):
    """``metric: TASK/METRIC`` in a claim's test reads each run's eval.json; a run without one is named, with the
    command that scores it."""
    from normbench.analysis.loading import find_runs
    from normbench.claims import verdict as V
    from normbench.claims.measure import judge_claim
    from test_reproduce import fake_run, write_claim

    test = {
        "name": "acc",
        "kind": "difference",
        "metric": "arc_easy/acc",
        "group": {"arch": "peri_ln"},
        "baseline": {"arch": "pre_ln"},
        "direction": "higher",
        "threshold": 0.02,
    }
    claim = write_claim(tmp_path / "claims", [test])
    runs = tmp_path / "runs"
    for seed, (pre, peri) in enumerate([(0.40, 0.46), (0.42, 0.49), (0.39, 0.45)]):
        for arch, value in (("pre_ln", pre), ("peri_ln", peri)):
            fake_run(runs / f"{arch}{seed}", arch, seed)
            write_eval(runs / f"{arch}{seed}", "0.4.13", 100, {"arc_easy": {"metrics": {"acc": {"value": value}}}})
    res = judge_claim(claim, find_runs(runs), "cpu")
    assert res["verdict"] == V.HOLDS and res["tests"][0]["effect"] == pytest.approx(0.0633, abs=1e-4)
    fake_run(runs / "peri_ln3", "peri_ln", 3)  # trained, never scored
    res = judge_claim(claim, find_runs(runs), "cpu")
    assert res["verdict"] == V.INCONCLUSIVE
    assert "1 of 4 runs have no arc_easy/acc (no eval.json score: python -m normbench eval" in res["reason"]


def test_a_claim_metric_is_a_known_one_or_task_slash_metric(tmp_path):
    from normbench.errors import ConfigError
    from test_reproduce import write_claim

    test = {
        "name": "acc",
        "kind": "difference",
        "metric": "arc_easy",
        "group": {"arch": "peri_ln"},
        "baseline": {"arch": "pre_ln"},
        "threshold": 0.02,
    }
    with pytest.raises(ConfigError, match=r"metric=arc_easy is not one of: .*, or TASK/METRIC"):
        write_claim(tmp_path / "claims", [test])


def test_the_tables_as_data_carry_each_runs_scores_and_each_groups_over_seeds(tmp_path):
    root = scored_sweep(tmp_path / "sweep")
    assert report.main([str(root), "--no-figures", "--group-by", "arch"]) == 0
    runs = json.loads((root / "report_runs.json").read_text())
    assert len(runs) == len(ACC) * len(NORM_SHIFT) * len(SEEDS)
    for row in runs:
        assert row["arc_easy/acc"] == pytest.approx(
            acc(row["arch"], row["run"].split("norm=")[1].split(",")[0], row["seed"])
        )
        assert list(row)[-1] == "reason"  # the scores before the reason, as the contract's column list
    groups = {g["arch"]: g for g in json.loads((root / "report_groups.json").read_text())}
    for arch in ACC:
        per_seed = [statistics.fmean(acc(arch, n, s) for n in NORM_SHIFT) for s in SEEDS]
        g = groups[arch]
        assert g["arc_easy/acc_mean"] == pytest.approx(statistics.fmean(per_seed))
        assert g["arc_easy/acc_std"] == pytest.approx(statistics.stdev(per_seed)) and g["arc_easy/acc_seeds"] == 3
    header = (root / "report_runs.csv").read_text().splitlines()[0].split(",")
    assert "arc_easy/acc" in header and header[-1] == "reason"


def test_no_eval_json_no_score_columns(tmp_path):
    root = make_sweep(tmp_path / "sweep")
    assert report.main([str(root), "--no-figures"]) == 0
    assert not any("/" in k for k in json.loads((root / "report_runs.json").read_text())[0])
