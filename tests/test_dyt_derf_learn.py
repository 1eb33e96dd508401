"""DyT and Derf learn on the default data (docs/dyt-derf.md, docs/init.md).

Each of LayerNorm, DyT and Derf trains once per arch (pre_ln, peri_ln) on ``model=tiny`` for 200
steps (seed 0, AdamW lr 2e-3, the default data) from ONE init, ``model.init_std=fan_in`` (the gain
nearest DyT's references; at the presets' ``auto`` they learn too, but 0.7 nats behind), in a
module-scoped fixture (about 2 minutes in all). Measured there (docs/init.md): LayerNorm 2.04/2.07,
DyT 2.25/2.23, Derf 2.21/2.2x (pre_ln/peri_ln): DyT/Derf trail LayerNorm by ~10% at one init (when they
were compared with LayerNorm started at 0.02, the init hid the gap). Without their residual-stream
fixes (docs/dyt-derf.md) DyT/Derf stayed at ~3.00, the loss of a model that ignores context, while
LayerNorm reached ~2.2; by step 50 their residual stream had grown 40-160x more than LayerNorm's
(pre_ln), and the final DyT saturated until every block gradient was exactly 0.

Residual growth is compared relative to each run's own start (variance after the last block /
variance of the embedding output at step 1): the DyT/Derf recipe's sqrt(d) embedding scalar puts
their residual stream at unit variance at step 1, ~64x LayerNorm's (0.125^2), before any training,
so absolute variances differ by construction.
"""

from __future__ import annotations

import json

import pytest

from normbench.train import trainer

from conftest import compose

pytestmark = pytest.mark.slow

ARCHS = ("pre_ln", "peri_ln")
NORMS = ("layernorm", "dyt", "derf")
RUN = [
    "model=tiny",
    "model.init_std=fan_in",
    "trainer.max_steps=200",
    "seed=0",
    "device=cpu",
    "optim=adamw",
    "optim.lr=2e-3",
    "diag=default",
    "diag.every=10",
    "trainer.ckpt_every=1000",
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(arch, norm) -> (summary, {step: var_resid list}) for one 200-step run each."""
    out = {}
    for arch in ARCHS:
        for norm in NORMS:
            run_dir = tmp_path_factory.mktemp(f"{arch}-{norm}")
            summary = trainer.run(compose([*RUN, f"arch={arch}", f"norm={norm}"]), run_dir)
            records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
            var = {r["step"]: r["var_resid"] for r in records if "var_resid" in r}
            out[arch, norm] = summary, var
    return out


@pytest.mark.parametrize("norm", ["dyt", "derf"])
@pytest.mark.parametrize("arch", ARCHS)
def test_learned_within_20pct_of_layernorm(runs, arch, norm):
    (ln, _), (s, _) = runs[arch, "layernorm"], runs[arch, norm]
    assert ln["status"] == s["status"] == "completed" and s["outcome"] == "learned"
    assert ln["best_val_loss"] < 2.4 and s["best_val_loss"] < 2.6  # far below the unigram level ~3.0
    assert s["best_val_loss"] <= 1.2 * ln["best_val_loss"], (arch, norm, s["best_val_loss"], ln["best_val_loss"])


@pytest.mark.parametrize("norm", ["dyt", "derf"])
@pytest.mark.parametrize("arch", ARCHS)
def test_residual_growth_within_10x_of_layernorm(runs, arch, norm):
    """At every diagnostic step: growth of the variance after the last block <= 10x LayerNorm's."""
    (_, ln), (_, var) = runs[arch, "layernorm"], runs[arch, norm]
    steps = sorted(ln)
    assert steps == sorted(var) and len(steps) == 21  # step 1, then every 10 steps to 200
    for step in steps:
        growth = var[step][-1] / var[1][0]
        ln_growth = ln[step][-1] / ln[1][0]
        assert growth <= 10 * ln_growth, (arch, norm, step, growth, ln_growth)
