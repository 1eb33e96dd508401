"""Run outcomes (learned/unstable/stuck/diverged), the no-context baseline and the per-layer
statistics of summary.json (normbench.diag.outcomes)."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

from normbench.data.corpus import load_data
from normbench.diag import outcomes
from normbench.run.metrics import read_jsonl
from normbench.train.trainer import Trainer, run

from conftest import TINY, compose


def test_unigram_entropy_by_hand_and_cached_with_the_tokens(tmp_path):
    tokens = np.array([0, 0, 1, 2], dtype=np.uint16)  # p = 1/2, 1/4, 1/4
    assert outcomes.unigram_entropy(tokens) == pytest.approx(1.5 * math.log(2))
    data = SimpleNamespace(cache_path=tmp_path, val=tokens)
    assert outcomes.baseline_loss(data) == pytest.approx(1.5 * math.log(2))
    cached = json.loads((tmp_path / "baseline.json").read_text())
    assert cached == {"unigram_entropy_val": pytest.approx(1.5 * math.log(2)), "n_val": 4}
    # a second call reads the cache (here doctored, to see that it is read) ...
    (tmp_path / "baseline.json").write_text(json.dumps({"unigram_entropy_val": 0.5, "n_val": 4}))
    assert outcomes.baseline_loss(data) == 0.5
    # ... unless it belongs to another split size
    data.val = np.array([3, 3, 3, 3, 4], dtype=np.uint16)  # p = 4/5, 1/5
    assert outcomes.baseline_loss(data) == pytest.approx(-(0.8 * math.log(0.8) + 0.2 * math.log(0.2)))


@pytest.mark.parametrize(
    "status, best, spikes, expected",
    [
        ("diverged", None, 0, "diverged"),
        ("diverged", 1.0, 3, "diverged"),
        ("completed", 2.95, 0, "stuck"),  # baseline 3.0 - margin 0.1 = 2.9: not beaten
        ("completed", 2.91, 0, "stuck"),
        ("completed", 2.95, 2, "stuck"),  # stuck wins over spikes
        ("completed", 2.89, 0, "learned"),
        ("completed", 2.0, 1, "unstable"),
        ("completed", None, 0, None),  # no val loss: cannot tell
        ("failed", 2.0, 0, None),
        ("interrupted", 2.0, 0, None),
        ("running", 2.0, 0, None),
    ],
)
def test_classify(status, best, spikes, expected):
    assert outcomes.STUCK_MARGIN == 0.1
    assert outcomes.classify(status, best, 3.0, spikes) == expected
    if status == "completed" and best is not None:
        assert outcomes.classify(status, best, None, spikes) is None  # no baseline recorded: cannot tell


def test_layer_statistics_against_hand_computed_values():
    """Synthetic records with two layers: every statistic worked out by hand."""
    records = [
        {"step": 1, "loss": 5.0, "spikes": 0},
        {
            "step": 1,
            "loss": 5.0,
            "var_resid": [0.5, 1.0, 2.0, 4.0],
            "grad_norm_layer": [3.0, 1.0, 2.0],
            "massive_ratio_resid": [5.0, 6.0, 7.0, 8.0],
            "logit_maxabs": 2.0,
        },
        {"step": 10, "loss": 4.0, "spikes": 1, "spike_steps": [7]},
        {
            "step": 20,
            "loss": 3.0,
            "var_resid": [0.5, 2.0, 3.0, 10.0],
            "grad_norm_layer": [1.0, 1.0, 4.0],
            "massive_ratio_resid": [5.0, 150.0, 9.0, 8.0],
            "logit_maxabs": 5.0,
            "spikes": 2,
            "spike_steps": [15],
        },
        {
            "step": 30,
            "loss": 3.0,
            "var_resid": [0.5, 2.0, 3.0, 8.0],
            "grad_norm_layer": [2.0, 2.0, 2.0],
            "massive_ratio_resid": [5.0, 120.0, 9.0, 8.0],
            "logit_maxabs": 4.0,
            "spikes": 2,
        },
    ]
    history = outcomes.History(records)
    got = outcomes.run_results({"status": "completed", "best_val_loss": 2.5, "spikes": 3}, history, 3.0, [25])

    # var growth = var_resid[L] / var_resid[1]: 4/1, 10/2, 8/2
    assert got["layer_series"]["var_growth"] == [[1, 4.0], [20, 5.0], [30, 4.0]]
    # grad spread = first / last block: 3/2, 1/4, 2/2
    assert got["layer_series"]["grad_spread"] == [[1, 1.5], [20, 0.25], [30, 1.0]]
    # CV of [3, 1, 2]: mean 2, population std sqrt(2/3); of [1, 1, 4]: mean 2, std sqrt(2); of [2, 2, 2]: 0
    cv = got["layer_series"]["grad_cv"]
    assert [s for s, _ in cv] == [1, 20, 30]
    assert [v for _, v in cv] == pytest.approx([math.sqrt(2 / 3) / 2, math.sqrt(2) / 2, 0.0])
    assert got["layer_series"]["massive_ratio_max"] == [[1, 8.0], [20, 150.0], [30, 120.0]]
    assert got["layer_series"]["logit_maxabs"] == [[1, 2.0], [20, 5.0], [30, 4.0]]
    # the end-of-run scalars: last diag step, the peak and the first step above 100
    assert got["var_growth"] == 4.0 and got["grad_spread"] == 1.0 and got["grad_cv"] == 0.0
    assert got["massive_ratio_peak"] == 150.0 and got["massive_ratio_step"] == 20
    assert got["logit_maxabs"] == 4.0 and got["massive_threshold"] == 100.0
    assert outcomes.layer_stats(got["layer_series"], threshold=200.0)["massive_ratio_step"] is None
    # spikes: the count from the trainer; the steps from the records plus the not yet logged one
    assert got["n_spikes"] == 3 and got["spike_steps"] == [7, 15, 25]
    assert got["outcome"] == "unstable" and got["baseline_loss"] == 3.0 and got["stuck_margin"] == 0.1


def test_no_diagnostics_gives_empty_statistics():
    history = outcomes.History([{"step": 1, "loss": 5.0}])
    got = outcomes.run_results({"status": "diverged", "spikes": 0}, history, 3.0)
    assert got["outcome"] == "diverged" and got["layer_series"] == {} and got["spike_steps"] == []
    assert got["var_growth"] is None and got["massive_ratio_peak"] is None and got["massive_ratio_step"] is None


def _train(tmp_path, *overrides):
    cfg = compose([*TINY, "device=cpu", *overrides])
    summary = run(cfg, tmp_path)
    return cfg, summary, json.loads((tmp_path / "summary.json").read_text())


def test_lr_zero_run_is_stuck_and_records_the_baseline(tmp_path):
    cfg, summary, on_disk = _train(tmp_path, "optim.lr=0", "trainer.max_steps=12")  # diag.every=10
    assert on_disk["status"] == "completed" and on_disk["outcome"] == "stuck"
    data = load_data(cfg.data, log=lambda _: None)
    assert on_disk["baseline_loss"] == pytest.approx(outcomes.unigram_entropy(data.val))
    assert (data.cache_path / "baseline.json").exists()
    # lr 0 never moves the weights: the val loss stays at the initial ~ln(256), far above the baseline
    assert on_disk["best_val_loss"] > on_disk["baseline_loss"] + 1.0
    assert on_disk["n_spikes"] == 0 and on_disk["spike_steps"] == []
    # the last step (12, not a multiple of diag.every) has a diagnostic record, and the statistics come from it
    diag = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if "var_resid" in r]
    assert [r["step"] for r in diag] == [1, 10, 12] and on_disk["layer_series"]["var_growth"][-1][0] == 12
    assert on_disk["var_growth"] == pytest.approx(diag[-1]["var_resid"][-1] / diag[-1]["var_resid"][1])


def test_the_run_end_reads_no_metrics_file(tmp_path, monkeypatch):
    """The recorder keeps each record's spike steps and layer statistics as it writes it (outcomes.History):
    the only read of metrics.jsonl is the writer's at the start, and the summary's numbers are the file's."""
    from normbench.run import metrics

    reads, read = [], metrics.read_jsonl
    monkeypatch.setattr(metrics, "read_jsonl", lambda path: reads.append(path) or read(path))
    spiky = ("trainer.max_steps=12", "diag.every=5", "diag.spike_factor=0.9", "diag.spike_window=5")
    _, _, on_disk = _train(tmp_path, *spiky)
    assert len(reads) == 1, "metrics.jsonl is read once, when the writer opens it"
    records = read(tmp_path / "metrics.jsonl")
    assert on_disk["spike_steps"] and on_disk["spike_steps"] == outcomes.spike_steps(records)
    assert on_disk["layer_series"] and on_disk["layer_series"] == outcomes.layer_series(records)


def test_huge_lr_run_diverges(tmp_path):
    _, _, on_disk = _train(tmp_path, "optim.lr=50", "trainer.max_steps=20")
    assert on_disk["status"] == "diverged" and on_disk["outcome"] == "diverged"
    assert math.isfinite(on_disk["baseline_loss"])


@pytest.mark.slow
def test_injected_spikes_make_a_learned_run_unstable(tmp_path, monkeypatch):
    """A run that learns (200 steps at lr 1e-2 beats the unigram baseline by ~0.4 nats), with its
    reported loss doubled at two steps: 2 spikes at those steps, outcome unstable."""
    inject = {150, 170}  # optimizer steps done before the step: the records number them 151, 171
    original = Trainer.train_step

    def spiky(self):
        loss, grad_norm = original(self)
        return (loss * 2 if self.step in inject else loss), grad_norm

    monkeypatch.setattr(Trainer, "train_step", spiky)
    _, _, on_disk = _train(tmp_path, "optim.lr=1e-2", "trainer.max_steps=200", "trainer.eval_every=50", "diag.every=50")
    assert on_disk["status"] == "completed"
    assert on_disk["best_val_loss"] < on_disk["baseline_loss"] - outcomes.STUCK_MARGIN
    assert on_disk["n_spikes"] == 2 and on_disk["spike_steps"] == [151, 171]
    assert on_disk["outcome"] == "unstable"
