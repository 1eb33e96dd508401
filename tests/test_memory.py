"""The memory estimate (normbench.runtime.memory): refusal in one line, the override, and the estimate
against the peak memory a run really takes (within a factor of 1.5 either way)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from normbench import cli
from normbench.model import build_model
from normbench.runtime import memory

from conftest import OFFLINE_ENV, REPO, compose

RUN = ["model=tiny", "model.seq_len=32", "trainer.batch_size=2", "trainer.max_steps=2", "trainer.eval_batches=1"]


def test_parameters_are_counted_exactly_without_building(tiny_cfg):
    for arch in ("pre_ln", "peri_ln", "ngpt"):
        cfg = tiny_cfg(f"arch={arch}")
        assert memory.count_params(cfg, 256)[0] == build_model(cfg, 256).num_params(), arch


def test_states_follow_the_optimizer():
    """fp32 weights + gradients + optimizer state: 16 bytes per parameter with AdamW, 12 with Lion."""
    adamw = memory.estimate(compose(["model=tiny"]), 256)
    lion = memory.estimate(compose(["model=tiny", "optim=lion"]), 256)
    assert adamw.states == 16 * adamw.params and lion.states == 12 * lion.params


def train(*args: str) -> int:
    try:
        return cli.main(["train", *args])
    except SystemExit as exc:  # a refused single run exits from inside the Hydra job
        return exc.code


def test_over_the_device_limit_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("NORMBENCH_TEST_MEMORY_LIMIT_GB", "0.001")  # a fake device with 1 MB
    code = train(*RUN, f"hydra.run.dir={tmp_path / 'a'}")
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "this run needs about" in err and "has 1.0 MB" in err and "trainer.skip_memory_check=true" in err
    assert not (tmp_path / "a" / "summary.json").exists() and not (tmp_path / "a" / ".lock").exists()
    # the override: the user knows better
    assert train(*RUN, "trainer.skip_memory_check=true", f"hydra.run.dir={tmp_path / 'b'}") == 0
    assert "more than available; training anyway" in (tmp_path / "b" / "train.log").read_text()


def test_a_huge_seq_len_is_refused_on_this_machine(tmp_path, capsys):
    """model.seq_len=100000 used to allocate until the kernel killed the process: now one line."""
    code = train("model=tiny", "model.seq_len=100000", f"hydra.run.dir={tmp_path}")
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "this run needs about" in err and "available RAM" in err


MEASURE = """
import json, sys, tempfile
from pathlib import Path
import torch
torch.set_num_threads(1)
from normbench.config.files import compose_config
from normbench.runtime import memory
from normbench.train import trainer

def status(key):
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(key))

tmp = Path(tempfile.mkdtemp())
small = ["model=tiny", "model.seq_len=32", "trainer.batch_size=2", "trainer.max_steps=1", "diag=off"]
trainer.run(compose_config(small), tmp / "warm")  # imports, data cache, allocator: the baseline
base = status("VmRSS")
open("/proc/self/clear_refs", "w").write("5")  # resets the peak (VmHWM)
cfg = compose_config(sys.argv[1:] + ["trainer.max_steps=2", "diag=off", "trainer.eval_batches=1"])
trainer.run(cfg, tmp / "run")
print(json.dumps({"measured": status("VmHWM") - base, "estimate": memory.estimate(cfg, 256).total}))
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "config",
    [
        "model=small model.seq_len=256 trainer.batch_size=16 model.mlp=gelu",
        "model=small model.seq_len=256 trainer.batch_size=8 model.dropout=0.1 arch=peri_ln",
        "model=small model.n_layer=6 model.seq_len=128 trainer.batch_size=16 arch=ngpt",
    ],
)
def test_estimate_is_within_a_factor_of_the_measured_peak(config, tmp_path):
    """Peak RSS over the process's baseline (Linux VmHWM) against the estimate, CPU, one thread."""
    if not (REPO / "src").is_dir() or sys.platform != "linux":
        pytest.skip("measures /proc/self/status")
    proc = subprocess.run(
        [sys.executable, "-c", MEASURE, *config.split()],
        cwd=tmp_path,
        env={**os.environ, **OFFLINE_ENV},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    ratio = got["estimate"] / got["measured"]
    assert 1 / 1.5 <= ratio <= 1.5, (
        f"{config}: estimate {got['estimate'] / 2**30:.3f} GB, peak {got['measured'] / 2**30:.3f} GB"
    )
