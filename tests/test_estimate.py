"""reproduce --dry-run's time estimate (reproduce/estimate.py): the CPU rate calibrated once per machine and torch
version, cached, and the load it was measured at stated in the printed estimate."""

from __future__ import annotations

import json
import re

import pytest

from normbench.reproduce import estimate as E
from normbench.reproduce.request import Request
from test_reproduce import VAR_TEST, write_claim


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty calibration cache, a fresh in-process memo, and a measurement that gives a new number each
    time (1, 2, 3, ... GFLOP/s): without the cache no two calibrations would agree."""
    monkeypatch.setenv("NORMBENCH_CACHE", str(tmp_path / "cache"))
    E.calibration.cache_clear()
    rates = iter(float(i) * 1e9 for i in range(1, 1000))
    monkeypatch.setattr(E, "_measure_once", lambda: next(rates))
    yield tmp_path / "cache" / "calibration.json"
    E.calibration.cache_clear()


def test_the_rate_is_the_median_of_its_repeats_and_read_back_from_the_cache(cache, monkeypatch):
    first = E.calibration()
    assert first["repeats"] == [1e9, 2e9, 3e9, 4e9, 5e9] and first["flops"] == 3e9 and E.cpu_rate() == 3e9
    saved = json.loads(cache.read_text())
    assert list(saved) == [E.machine_key()] and saved[E.machine_key()]["cpu_count"] >= 1
    assert len(saved[E.machine_key()]["loadavg"]) == 3
    E.calibration.cache_clear()  # a new process: no memo, only the file
    monkeypatch.setattr(E, "_measure_once", lambda: pytest.fail("measured again instead of reading the cache"))
    assert E.calibration() == first


def test_the_cache_key_changes_with_the_torch_version(cache, monkeypatch):
    import torch

    old_key, old = E.machine_key(), E.calibration()
    monkeypatch.setattr(torch, "__version__", "99.0.0")
    E.calibration.cache_clear()
    assert E.machine_key() != old_key and "torch 99.0.0" in E.machine_key()
    assert E.calibration()["flops"] == 8e9  # measured anew: repeats 6..10
    assert set(json.loads(cache.read_text())) == {old_key, E.machine_key()} and old["flops"] == 3e9


def test_an_unreadable_cache_is_measured_again(cache):
    cache.parent.mkdir(parents=True)
    cache.write_text("{not json")
    assert E.calibration()["flops"] == 3e9 and E.machine_key() in json.loads(cache.read_text())


def test_two_dry_runs_print_the_same_estimate_with_the_load_it_was_measured_at(cache, tmp_path):
    from normbench.reproduce.runner import reproduce

    claim = write_claim(tmp_path / "claims", [VAR_TEST], fixed=("model=tiny", "trainer.max_steps=2000", "device=cpu"))
    printed = []
    for _ in range(2):
        lines = []
        assert reproduce(claim, Request(out=tmp_path / "out", dry_run=True), log=lines.append) is None
        printed.append(next(ln for ln in lines if "(estimate;" in ln))
        E.calibration.cache_clear()  # the second call reads the file, as a second process would
    assert printed[0] == printed[1]
    assert re.search(
        r"\(estimate; CPU speed calibrated \d{4}-\d\d-\d\d \d\d:\d\d at load \d+\.\d on \d+ cores\)", printed[0]
    ), printed[0]
