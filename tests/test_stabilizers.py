"""QK-Clip (src/normbench/model/stabilizers.py): the max-logit statistic, the per-head rescale, the trainer hook.

Logits are recomputed here by hand from the weights (q = W_q x, RoPE by its formula, q.k / sqrt(d_h)
over causal pairs) in float64, so the "brought to exactly tau" check does not reuse the code under test.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from normbench.errors import ConfigError
from normbench.model import build_model
from normbench.model.stabilizers import QKClip, head_logit_max
from normbench.train import trainer

from conftest import compose


def test_head_logit_max_by_hand_and_causal_mask():
    torch.manual_seed(0)
    q, k = torch.randn(2, 3, 5, 4, dtype=torch.float64), torch.randn(2, 3, 5, 4, dtype=torch.float64)
    k[1, 2, 4] = 100.0 * q[1, 2, 0]  # a huge logit at a future key (j=4 > i=0): must not count
    scale = 0.5
    want = torch.full((3,), -math.inf, dtype=torch.float64)
    for b in range(2):
        for h in range(3):
            for i in range(5):
                for j in range(i + 1):
                    want[h] = max(want[h], float(q[b, h, i] @ k[b, h, j]) * scale)
    got = head_logit_max(q, k, scale)
    assert torch.allclose(got, want, rtol=1e-12, atol=0)
    assert got[2] < 50  # the planted future logit (100 |q|^2 / 2) was masked


def _attn_input(model, idx):
    """Block 0's attention input (the normed embedding under pre_ln), by a forward hook."""
    seen = {}
    attn = model.blocks[0].attn.core
    handle = attn.register_forward_hook(lambda m, args, out: seen.setdefault("x", args[0].detach()))
    model(idx)
    handle.remove()
    return seen["x"]


def _logits_by_hand(attn, x, theta):
    """(H,) causal max of q_i.k_j / sqrt(d_h), from W_q, W_k and the RoPE formula."""
    B, T, d = x.shape
    H, hd = attn.n_head, attn.head_dim
    W = attn.c_attn.weight.detach()
    b = attn.c_attn.bias.detach() if attn.c_attn.bias is not None else torch.zeros(3 * d, dtype=W.dtype)
    q = (x @ W[:d].T + b[:d]).view(B, T, H, hd).transpose(1, 2)
    k = (x @ W[d : 2 * d].T + b[d : 2 * d]).view(B, T, H, hd).transpose(1, 2)
    half = hd // 2
    ang = torch.arange(T, dtype=x.dtype)[:, None] * theta ** (-torch.arange(half, dtype=x.dtype) * 2 / hd)
    cos, sin = ang.cos(), ang.sin()

    def rot(v):
        a, b = v[..., :half], v[..., half:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)

    s = rot(q) @ rot(k).transpose(-2, -1) / math.sqrt(hd)
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)
    return s.amax(dim=(0, 2, 3))


@pytest.mark.parametrize("bias", [False, True])
def test_planted_head_goes_to_exactly_tau_and_others_stay_bit_exact(bias):
    cfg = compose(["model=tiny", f"model.bias={bias}"])
    torch.manual_seed(0)
    model = build_model(cfg, 256).double()
    attn = model.blocks[0].attn.core
    d, hd = attn.n_head * attn.head_dim, attn.head_dim
    with torch.no_grad():  # plant: head 2 of block 0 gets large q and k rows
        attn.c_attn.weight[2 * hd : 3 * hd].mul_(40.0)
        attn.c_attn.weight[d + 2 * hd : d + 3 * hd].mul_(40.0)
        if bias:
            attn.c_attn.bias.normal_(0, 0.5)
    idx = torch.randint(0, 256, (3, 32))
    x = _attn_input(model, idx)
    before = _logits_by_hand(attn, x, cfg.model.rope_theta)
    tau = float(before[2]) / 3
    assert before[2] > tau and all(before[h] < tau for h in (0, 1, 3))  # only the planted head is over
    clip = QKClip(model, tau)
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    model.train()
    model(idx)
    s = clip.step()
    assert torch.allclose(s[0].double(), before, rtol=1e-9)  # the forward measured it
    after = _logits_by_hand(attn, x, cfg.model.rope_theta)
    assert float(after[2]) == pytest.approx(tau, rel=1e-12)  # exactly tau (fp64 model: fp64 gamma)
    assert torch.equal(after[[0, 1, 3]], before[[0, 1, 3]])
    W, W0 = attn.c_attn.weight, weights["blocks.0.attn.core.c_attn.weight"]
    untouched = [r for r in range(3 * d) if not (2 * hd <= r < 3 * hd or d + 2 * hd <= r < d + 3 * hd)]
    assert torch.equal(W[untouched], W0[untouched])  # other heads and all of W_v: bit-exact
    for n, p in model.named_parameters():
        if n not in ("blocks.0.attn.core.c_attn.weight", "blocks.0.attn.core.c_attn.bias"):
            assert torch.equal(p, weights[n]), n  # block 1 had no head over tau
    assert torch.all(clip.attns[0].logit_max == -math.inf)  # reset for the next step
    assert clip.metrics()["qk_clip_heads"] == [1, 0] and clip.metrics() == {}


def test_max_is_over_all_micro_batches_and_eval_does_not_count():
    cfg = compose(["model=tiny"])
    torch.manual_seed(0)
    model = build_model(cfg, 256)
    clip = QKClip(model, 1e9)
    a, b = torch.randint(0, 256, (2, 16)), torch.randint(0, 256, (2, 16))
    model.train()
    per = []
    for batch in (a, b):
        model(batch)
        per.append(clip.step())
    model(a)
    model(b)
    model.eval()
    model(torch.randint(0, 256, (2, 16)))  # evaluation forwards are not training logits
    assert torch.equal(clip.step(), torch.maximum(*per))


def _run(tmp_path, name, *overrides):
    run_dir = tmp_path / name
    summary = trainer.run(
        compose(
            [
                "model=tiny",
                "trainer.batch_size=4",
                "trainer.max_steps=16",
                "trainer.log_every=1",
                "trainer.eval_every=16",
                "trainer.eval_batches=1",
                "diag=off",
                "sched=constant",
                "sched.warmup_steps=0",
                *overrides,
            ]
        ),
        run_dir,
    )
    return summary, [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(("optim", "lr", "tau"), [("adamw", "optim.lr=2e-2", 5.0), ("muon", "optim.lr=0.2", 4.0)])
def test_trains_with_muon_and_adamw_and_holds_the_logit(tmp_path, optim, lr, tau):
    """Unclipped, the largest logit grows past 4 tau within 16 steps (AdamW to ~55+, Muon to ~19); with
    QK-Clip each step's measured max (the weights clipped to tau, then one optimizer step) stays under
    2.5 tau and half the unclipped peak, and the loss still falls. At these high LRs one step moves a
    just-clipped head well past tau (both settle near 1.6 tau: an AdamW step is ~lr per entry, Muon's
    has a fixed spectral size); the exact rescale is checked above."""
    free, free_recs = _run(tmp_path, "free", f"optim={optim}", lr, "optim.qk_clip=true", "optim.qk_clip_tau=1e9")
    clipped, recs = _run(tmp_path, "clip", f"optim={optim}", lr, "optim.qk_clip=true", f"optim.qk_clip_tau={tau}")
    assert free["status"] == clipped["status"] == "completed"
    assert sum(sum(r["qk_clip_heads"]) for r in free_recs) == 0  # tau 1e9: measured, never acted
    free_peak = max(max(r["qk_clip_logit_max"]) for r in free_recs)
    assert free_peak > 4 * tau
    assert sum(sum(r["qk_clip_heads"]) for r in recs) > 0
    first = next(i for i, r in enumerate(recs) if sum(r["qk_clip_heads"]))
    held = max(max(r["qk_clip_logit_max"]) for r in recs[first + 1 :])
    assert held < 2.5 * tau and held < free_peak / 2
    assert recs[-1]["loss"] < recs[0]["loss"] - 0.5


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["arch=ngpt"], "optim.qk_clip=true with arch=ngpt"),
        (["arch.qk_norm=true"], "a norm after W_q/W_k cancels the rescale"),
        (["arch=hybridnorm"], "arch=hybridnorm (always has q/k norms)"),
        (["arch=simplenorm"], "arch=simplenorm (always has q/k norms)"),
        (["parallel=fsdp"], "with parallel=fsdp"),
        (["optim.qk_clip_tau=0"], "optim.qk_clip_tau=0.0 must be > 0"),
    ],
)
def test_refused_where_it_cannot_act(overrides, needle):
    from normbench.validation import validate

    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        validate(compose(["model=tiny", "optim.qk_clip=true", *overrides]))


def test_compiles_to_one_graph_and_measures_as_eager():
    """compile=true: the per-head max is updated inside the graph (no graph break, fullgraph) and
    equals the eager value, over two forwards (the in-place slot keeps its identity across steps)."""
    model = build_model(compose(["model=tiny"]), 256)
    clip = QKClip(model, 1e9)
    a, b = torch.randint(0, 256, (2, 16)), torch.randint(0, 256, (2, 16))
    model.train()
    model(a)
    model(b)
    eager = clip.step()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    compiled(a)
    compiled(b)
    torch.testing.assert_close(clip.step(), eager, rtol=1e-6, atol=0)
    compiled(a)  # after the reset: the same graph, the slot refilled
    assert clip.step().amax() > 0
