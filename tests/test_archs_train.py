"""Every sensible arch x norm combination trains; the others fail at start-up with one line.

In-process ``trainer.run`` on a tiny model (4 layers so that Mix-LN has a Post-LN
block, d 64, seq 32, batch 4) for 30 steps with a fixed seed; the loss must
fall clearly. Also: ``arch.qk_norm=true`` trains for every softmax arch, nGPT
notes that it ignores ``norm=``, and the parameter count printed at start and
stored in summary.json is the number of unique parameters.
"""

from __future__ import annotations

import json
import statistics

import pytest
import torch

from normbench.errors import ConfigError
from normbench.model import build_model
from normbench.train import trainer

from conftest import compose, run_cli

SOFTMAX_ARCHS = ("pre_ln", "post_ln", "peri_ln", "mix_ln", "hybridnorm", "hybridnorm_star", "deepnorm")
NORMS = ("layernorm", "rmsnorm", "dyt", "derf")
VALID = [(a, n) for a in SOFTMAX_ARCHS for n in NORMS] + [("pre_ln", "none"), ("ngpt", "layernorm")]
INVALID = [([f"arch={a}", "norm=none"], "norm=none") for a in SOFTMAX_ARCHS if a != "pre_ln"] + [
    (["arch=pre_ln", "norm=none", "arch.qk_norm=true"], "qk_norm"),
    (["arch=post_ln", "norm=layernorm", "norm.embed_scale=true"], "embed_scale"),
]
RUN = [
    "model=tiny",
    "model.n_layer=4",
    "model.seq_len=32",
    "trainer.batch_size=4",
    "trainer.max_steps=30",
    "trainer.log_every=1",
    "trainer.eval_every=1000",
    "trainer.eval_batches=2",
    "trainer.ckpt_every=1000",
    "diag=off",
    "device=cpu",
    "seed=0",
    "optim.lr=3e-3",
]


def train(tmp_path, *overrides):
    cfg = compose([*RUN, *overrides])
    summary = trainer.run(cfg, tmp_path)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    return cfg, summary, records


def assert_learns(summary, records, label):
    assert summary["status"] == "completed", (label, summary["reason"])
    losses = [r["loss"] for r in records]
    assert len(losses) == 30
    first, last = statistics.mean(losses[:3]), statistics.mean(losses[-3:])
    vals = [r["val_loss"] for r in records if "val_loss" in r]
    assert len(vals) == 2  # at step 1 and at the end
    assert last < first - 0.3, (label, first, last)
    assert vals[-1] < vals[0] - 0.3, (label, vals)


# In the default suite: every arch with RMSNorm and every norm under Pre-LN (and nGPT); the rest of the matrix in the
# slow suite (CI runs both)
def _matrix_param(arch: str, norm: str):
    core = norm == "rmsnorm" or arch in ("pre_ln", "ngpt")
    return pytest.param(arch, norm, marks=() if core else pytest.mark.slow, id=f"{arch}-{norm}")


@pytest.mark.parametrize("arch,norm", [_matrix_param(a, n) for a, n in VALID])
def test_arch_norm_trains(tmp_path, arch, norm):
    _, summary, records = train(tmp_path, f"arch={arch}", f"norm={norm}")
    assert_learns(summary, records, f"{arch}/{norm}")
    assert summary["arch"] == arch and summary["norm"] == norm
    log = (tmp_path / "train.log").read_text()
    if arch == "ngpt":
        assert f"arch=ngpt ignores norm={norm}" in log
    else:
        assert "ignores norm=" not in log


@pytest.mark.parametrize("arch", SOFTMAX_ARCHS)
def test_qk_norm_trains(tmp_path, arch):
    cfg, summary, records = train(tmp_path, f"arch={arch}", "norm=rmsnorm", "arch.qk_norm=true")
    assert_learns(summary, records, f"{arch}+qk_norm")
    model = build_model(cfg, 256)
    assert all(b.attn.core.q_norm is not None and b.attn.core.k_norm is not None for b in model.blocks)


@pytest.mark.parametrize("overrides,word", INVALID, ids=[" ".join(o) for o, _ in INVALID])
def test_nonsense_combinations_fail_at_start(tmp_path, overrides, word):
    cfg = compose([*RUN, *overrides])
    with pytest.raises(ConfigError) as exc:
        trainer.run(cfg, tmp_path)
    msg = str(exc.value)
    assert "\n" not in msg and word in msg
    assert not (tmp_path / "metrics.jsonl").exists()  # nothing trained


def test_nonsense_combination_cli_one_line(tmp_path):
    proc = run_cli(["train", "arch=deepnorm", "norm=none", "model=tiny"], cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("normbench: error:") and "norm=none" in lines[0]
    assert not (tmp_path / "outputs").exists()


def unique_numel(model: torch.nn.Module) -> int:
    seen = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        seen[id(p)] = p.numel()
    return sum(seen.values())


@pytest.mark.parametrize("arch", [*SOFTMAX_ARCHS, "ngpt"])
def test_param_count_logged_and_in_summary(tmp_path, arch):
    cfg, summary, _ = train(tmp_path, f"arch={arch}", "trainer.max_steps=2", "trainer.log_every=1")
    model = build_model(cfg, 256)
    n = unique_numel(model)
    assert summary["n_params"] == n
    assert f"{n:,} params" in (tmp_path / "train.log").read_text()
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["n_params"] == n


def test_param_count_by_hand():
    """Pre-LN, RMSNorm, SwiGLU, no bias, tied embeddings: V*d + L*(4d^2 + 3*d*d_ff + 2d) + d."""
    cfg = compose(["model=tiny", "arch=pre_ln", "norm=rmsnorm"])
    V, d, L = 256, cfg.model.d_model, cfg.model.n_layer
    d_ff = 192  # 8/3 * 64 rounded up to a multiple of 32
    expected = V * d + L * (4 * d * d + 3 * d * d_ff + 2 * d) + d
    assert build_model(cfg, V).num_params() == expected
    # untying adds exactly one V x d matrix
    cfg = compose(["model=tiny", "arch=pre_ln", "norm=rmsnorm", "model.tie_embeddings=false"])
    assert build_model(cfg, V).num_params() == expected + V * d
