"""Training diagnostics (docs/contract.md §4): known answers, real runs, no hooks, spikes, one transfer."""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch

from normbench.diag import diagnostics as diag_mod
from normbench.diag.diagnostics import Diagnostics, Gather, SpikeDetector, residual_stats
from normbench.diag.wandb_logger import flatten_record
from normbench.model import build_model
from normbench.model.attention import apply_rope, record_attention_stats
from normbench.run.metrics import read_jsonl
from normbench.train.trainer import run

from conftest import TINY, compose

VOCAB = 256
DEFAULT_KEYS = {
    "grad_norm_layer",
    "grad_norm_attn",
    "grad_norm_mlp",
    "grad_norm_other",
    "update_ratio_layer",
    "var_resid",
    "rms_resid",
    "maxabs_resid",
    "massive_ratio_resid",
    "logit_maxabs",
}
FULL_KEYS = {"attn_entropy", "attn_logit_max", "kurtosis_resid", "angular_dist_layer"}
PER_RESID = {"var_resid", "rms_resid", "maxabs_resid", "massive_ratio_resid", "kurtosis_resid"}
ALL_DIAG = DEFAULT_KEYS | FULL_KEYS


def make(*overrides: str, n_layer: int = 2, diag: str = "full"):
    """(model, Diagnostics) for a tiny model with seed-0 weights and a fixed (2, 17) token batch."""
    cfg = compose([*TINY, f"model.n_layer={n_layer}", f"diag={diag}", *overrides])
    torch.manual_seed(0)
    model = build_model(cfg, VOCAB)
    batch = torch.randint(0, VOCAB, (2, 17), generator=torch.Generator().manual_seed(1))
    return model, Diagnostics(cfg.diag, model, batch)


def approx(a, b, rel=1e-5, abs=1e-7):
    return pytest.approx(b, rel=rel, abs=abs) == a


# ------------------------------------------------------------ hand-built tensors
def test_residual_stats_hand_values():
    # h0 tokens (1,-1), (3,-3); h1 = (1,1), (-3,3); h2 = 2 * h1.  Worked out by hand:
    h0 = torch.tensor([[[1.0, -1.0], [3.0, -3.0]]])
    h1 = torch.tensor([[[1.0, 1.0], [-3.0, 3.0]]])
    g = Gather()
    residual_stats([h0, h1, 2 * h1], full=True, g=g)
    r = g.result()
    assert approx(r["var_resid"], [5.0, 4.75, 19.0])  # mean 0 / 0.5 / 1: E[x^2] - mean^2
    assert approx(r["rms_resid"], [math.sqrt(5), math.sqrt(5), math.sqrt(20)])
    assert approx(r["maxabs_resid"], [3.0, 3.0, 6.0])
    assert approx(r["massive_ratio_resid"], [3.0, 3.0, 3.0])  # |x| = 1,1,3,3: median 1
    k1 = ((0.5**4) * 2 + 3.5**4 + 2.5**4) / 4 / 4.75**2  # centred values 0.5, 0.5, -3.5, 2.5
    assert approx(r["kurtosis_resid"], [41 / 25, k1, k1])  # kurtosis is scale-free
    # token 0: (1,-1) vs (1,1) orthogonal -> 1; token 1: (3,-3) vs (-3,3) opposite -> 2; h2 = 2 h1 -> 0
    assert approx(r["angular_dist_layer"], [1.5, 0.0], abs=1e-6)


def _by_hand(values: list[float]) -> dict:
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / n
    absval = sorted(abs(v) for v in values)
    return {
        "var_resid": var,
        "rms_resid": math.sqrt(sum(v * v for v in values) / n),
        "maxabs_resid": absval[-1],
        "massive_ratio_resid": absval[-1] / absval[(n - 1) // 2],  # lower median, like torch.median
        "kurtosis_resid": sum((v - mean) ** 4 for v in values) / n / var**2,
    }


def test_residual_stats_match_plain_python_on_random_states():
    gen = torch.Generator().manual_seed(3)
    hidden = [torch.randn(2, 3, 4, generator=gen) * (i + 1) + i for i in range(4)]
    hidden[2][0, 1, 2] = 50.0  # one massive activation
    g = Gather()
    residual_stats(hidden, full=True, g=g)
    r = g.result()
    for i, h in enumerate(hidden):
        want = _by_hand(h.reshape(-1).tolist())
        for key, value in want.items():
            assert approx(r[key][i], value, rel=1e-4), (key, i)
    assert r["maxabs_resid"][2] == 50.0
    for i in range(3):
        a, b = hidden[i].reshape(-1, 4).tolist(), hidden[i + 1].reshape(-1, 4).tolist()
        cos = [sum(x * y for x, y in zip(u, v)) / math.hypot(*u) / math.hypot(*v) for u, v in zip(a, b)]
        assert approx(r["angular_dist_layer"][i], sum(1 - c for c in cos) / len(cos), rel=1e-4)


def test_attention_stats_hand_values():
    q = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]]).view(1, 1, 3, 2)
    k = torch.tensor([[1.0, 0.0], [2.0, 0.0], [0.0, 5.0]]).view(1, 1, 3, 2)
    stats: dict = {}
    record_attention_stats(stats, q, k, 0.5)
    # rows (causal, scale 0.5): [0.5], [0, 0], [0.5, 1, 2.5]; the masked entry (1, 2) would be 5
    row2 = [0.5, 1.0, 2.5]
    z = sum(math.exp(v) for v in row2)
    h2 = -sum(math.exp(v) / z * (v - math.log(z)) for v in row2)
    assert approx(stats["attn_entropy"].item(), (0.0 + math.log(2) + h2) / 3)
    assert approx(stats["attn_logit_max"].item(), 2.5)


def test_spike_detector_on_a_loss_sequence():
    det = SpikeDetector(factor=1.5, window=5)  # checks start once 5 losses are known
    losses = [9.0, 2, 2, 2, 2, 3.1, 2.9, 3.0, 4.4, 2.0]
    flags = [det.update(v, step) for step, v in enumerate(losses, 1)]
    # step 6: 3.1 > 1.5 * median(9, 2, 2, 2, 2) = 3;  step 7: 2.9 < 3;  step 8: 3.0 is not > 1.5 * median(2, 2, 2,
    # 3.1, 2.9) = 3;  step 9: 4.4 > 1.5 * median(2, 2, 3.1, 2.9, 3.0) = 4.35;  step 10: 2.0 < 4.5
    assert [s for s, f in zip(range(1, 11), flags) if f] == [6, 9]
    assert det.count == 2 and det.pop_steps() == [6, 9] and det.pop_steps() == []
    assert list(det.recent) == [3.1, 2.9, 3.0, 4.4, 2.0]

    # a window of 50 checks after 10 losses: the first ten can never be spikes
    det = SpikeDetector(factor=2.0, window=50)
    assert not any(det.update(v) for v in [1.0] * 9 + [100.0])
    assert det.update(100.0) and det.count == 1  # median of 1 x 9, 100 is 1

    # the checkpoint state continues exactly
    a = SpikeDetector(1.5, 5)
    for v in [1, 1, 1, 1, 1, 2]:
        a.update(v)
    b = SpikeDetector(1.5, 5)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert b.state_dict() == a.state_dict() == {"spikes": 1, "recent_losses": [1, 1, 1, 1, 2]}
    assert [a.update(v) for v in [1.6, 3.0, 1.0]] == [b.update(v) for v in [1.6, 3.0, 1.0]] == [True, True, False]
    assert a.count == b.count == 3


def test_flatten_record_for_wandb():
    rec = {"step": 3, "loss": 2.5, "val_loss": None, "grad_norm_layer": [float(i) for i in range(11)], "spikes": 0}
    flat = flatten_record(rec)
    assert flat == {
        "step": 3,
        "loss": 2.5,
        "spikes": 0,
        **{f"grad_norm_layer/layer_{i:02d}": float(i) for i in range(11)},
    }


# ---------------------------------------------------------- gradient norms
def _block_subs(model, i):
    """(attention parameters, MLP parameters) of block i, by module (not by name)."""
    b = model.blocks[i]
    if hasattr(b, "attn"):
        return list(b.attn.parameters()), list(b.mlp.parameters())
    attn = [*b.c_attn.parameters(), *b.att_c_proj.parameters(), *b.attn_alpha.parameters(), *b.sqk.parameters()]
    mlp = [*b.c_fc.parameters(), *b.mlp_c_proj.parameters(), *b.mlp_alpha.parameters(), *b.suv.parameters()]
    return attn, mlp


@pytest.mark.parametrize(
    "overrides", [["arch=pre_ln"], ["arch=peri_ln"], ["arch=hybridnorm", "norm=dyt"], ["arch=ngpt"]]
)
def test_grad_norms_of_set_gradients(overrides):
    """Gradients set to constants: block i's attention grads all i+1, MLP grads 10(i+1), the rest 0.5."""
    L = 3
    model, d = make(*overrides, n_layer=L, diag="default")
    block_ids = set()
    n_attn, n_mlp = [], []
    for i in range(L):
        attn, mlp = _block_subs(model, i)
        assert len(attn) + len(mlp) == len(list(model.blocks[i].parameters()))
        for p in attn:
            p.grad = torch.full_like(p, float(i + 1))
        for p in mlp:
            p.grad = torch.full_like(p, 10.0 * (i + 1))
        block_ids |= {id(p) for p in attn + mlp}
        n_attn.append(sum(p.numel() for p in attn))
        n_mlp.append(sum(p.numel() for p in mlp))
    others = [p for p in model.parameters() if id(p) not in block_ids]
    for p in others:
        p.grad = torch.full_like(p, 0.5)
    d.grad_norms()
    r = d._pending.result()
    want_attn = [(i + 1) * math.sqrt(n_attn[i]) for i in range(L)]
    want_mlp = [10 * (i + 1) * math.sqrt(n_mlp[i]) for i in range(L)]
    assert approx(r["grad_norm_attn"], want_attn)
    assert approx(r["grad_norm_mlp"], want_mlp)
    assert approx(r["grad_norm_layer"], [math.hypot(a, m) for a, m in zip(want_attn, want_mlp)])
    assert approx(r["grad_norm_other"], 0.5 * math.sqrt(sum(p.numel() for p in others)))
    total = torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf).item()
    assert approx(sum(v * v for v in r["grad_norm_layer"]) + r["grad_norm_other"] ** 2, total**2)

    # a parameter without a gradient counts as zero instead of dropping the record
    attn0 = _block_subs(model, 0)[0]
    attn0[0].grad = None
    d.grad_norms()
    r = d._pending.result()
    assert approx(r["grad_norm_attn"][0], math.sqrt(n_attn[0] - attn0[0].numel()))


@pytest.mark.parametrize("arch", ["post_ln", "ngpt"])
def test_grad_norms_of_a_real_backward_sum_to_the_total(arch):
    L = 3
    model, d = make(f"arch={arch}", n_layer=L, diag="default")
    x = d.batch
    _, loss = model(x[:, :-1], x[:, 1:])
    loss.backward()
    d.grad_norms()
    r = d._pending.result()
    for i in range(L):
        attn, mlp = _block_subs(model, i)
        a = math.sqrt(sum(p.grad.double().pow(2).sum().item() for p in attn))
        m = math.sqrt(sum(p.grad.double().pow(2).sum().item() for p in mlp))
        assert approx(r["grad_norm_attn"][i], a, rel=1e-4) and approx(r["grad_norm_mlp"][i], m, rel=1e-4)
        assert approx(r["grad_norm_layer"][i] ** 2, r["grad_norm_attn"][i] ** 2 + r["grad_norm_mlp"][i] ** 2)
        assert r["grad_norm_layer"][i] > 0
    total = torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf).item()  # what the trainer logs
    assert approx(sum(v * v for v in r["grad_norm_layer"]) + r["grad_norm_other"] ** 2, total**2, rel=1e-4)


@pytest.mark.parametrize("arch", ["pre_ln", "ngpt"])
def test_update_ratio_over_one_step(arch):
    L = 3
    model, d = make(f"arch={arch}", n_layer=L, diag="default")
    # SGD, lr 0.1, gradient of block i = (i+1) * theta  ->  delta = -0.1 (i+1) theta: ratio 0.1 (i+1)
    for name, p in model.named_parameters():
        p.grad = p.detach() * (int(name.split(".")[1]) + 1) if name.startswith("blocks.") else torch.ones_like(p)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    d.before_step()
    opt.step()
    d.after_step()
    r = d._pending.result()
    assert approx(r["update_ratio_layer"], [0.1 * (i + 1) for i in range(L)], rel=1e-5)

    # AdamW around one real step, by hand
    before = [[p.detach().clone() for p in model.blocks[i].parameters()] for i in range(L)]
    _, loss = model(d.batch[:, :-1], d.batch[:, 1:])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    opt.zero_grad()
    loss.backward()
    d.before_step()
    opt.step()
    d.after_step()
    r = d._pending.result()
    for i in range(L):
        after = list(model.blocks[i].parameters())
        num = math.sqrt(sum((a.double() - b.double()).pow(2).sum().item() for a, b in zip(after, before[i])))
        den = math.sqrt(sum(b.double().pow(2).sum().item() for b in before[i]))
        assert approx(r["update_ratio_layer"][i], num / den, rel=1e-4)


# ------------------------------------------------------- the fixed-batch forward
def test_collect_matches_a_forward_by_hand_pre_ln():
    model, d = make("arch=pre_ln", n_layer=2, diag="full")
    idx = d.batch[:, :-1]
    r = d.collect()
    assert all(m.attn.core.stats is None for m in model.blocks)  # stats are switched off again
    with torch.no_grad():
        rope = model.rope(idx.device)
        x = model.wte(idx)  # tiny: RoPE, no wpe, no embedding scale/norm
        hs, entropies, maxes = [x], [], []
        for block in model.blocks:
            sub, core = block.attn, block.attn.core
            h = sub.norm_in(x)
            B, T, C = h.shape
            assert core.q_norm is None and core.v_norm is None
            q, k, v = (t.transpose(1, 2) for t in core.c_attn(h).view(B, T, 3, core.n_head, core.head_dim).unbind(2))
            q, k = apply_rope(q, rope[0][:T], rope[1][:T]), apply_rope(k, rope[0][:T], rope[1][:T])
            logits = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(core.head_dim)
            causal = torch.ones(T, T, dtype=torch.bool).tril()
            p = logits.masked_fill(~causal, -math.inf).softmax(-1)
            entropies.append(-(p * p.clamp_min(1e-300).log()).sum(-1).mean().item())
            maxes.append(logits[..., causal].max().item())
            y = core.c_proj((p.float() @ v).transpose(1, 2).reshape(B, T, C))
            assert torch.allclose(x + y, sub(x, rope), atol=1e-5)  # the probabilities are the model's
            x = block(x, rope)
            hs.append(x)
        logits_out, _ = model(idx)
    for i, h in enumerate(hs):
        want = _by_hand(h.reshape(-1).tolist())
        for key, value in want.items():
            assert approx(r[key][i], value, rel=1e-4), (key, i)
    assert approx(r["attn_entropy"], entropies, rel=1e-4)
    assert approx(r["attn_logit_max"], maxes, rel=1e-4)
    assert approx(r["logit_maxabs"], logits_out.abs().max().item())
    assert 0 < r["attn_entropy"][0] < math.log(16)  # below uniform over all 16 keys


def test_ngpt_stream_is_unit_norm_and_scalars_at_init():
    L, dm = 3, 64
    model, d = make("arch=ngpt", n_layer=L, diag="full")
    r = d.collect()
    assert len(r["rms_resid"]) == L + 1
    assert approx(r["rms_resid"], [1 / math.sqrt(dm)] * (L + 1), rel=1e-4)  # every token vector has norm 1
    assert all(v <= 1 / dm * (1 + 1e-4) for v in r["var_resid"])  # var = 1/d - mean^2
    assert all(0 < m <= 1 for m in r["maxabs_resid"])
    assert approx(r["ngpt_alpha_attn"], [0.05] * L) and approx(r["ngpt_alpha_mlp"], [0.05] * L)
    assert approx(r["ngpt_sqk"], [1.0] * L) and approx(r["ngpt_suv"], [1.0] * L) and approx(r["ngpt_sz"], 1.0)
    hd = dm // 4
    assert all(0 < v <= math.sqrt(hd) * (1 + 1e-5) for v in r["attn_logit_max"])  # |s_qk q.k| sqrt(hd) <= sqrt(hd)


def test_post_ln_stream_is_normalized_at_init():
    L = 3
    model, d = make("arch=post_ln", "norm=layernorm", n_layer=L, diag="default")
    r = d.collect()
    for i in range(1, L + 1):  # LayerNorm output, gain 1, bias 0: per-token mean 0, var s^2/(s^2+eps)
        assert approx(r["var_resid"][i], r["rms_resid"][i] ** 2, rel=1e-5)
        assert 0.9 < r["var_resid"][i] <= 1.0 + 1e-6
    assert r["var_resid"][0] < 0.01  # the embedding, N(0, 0.02)


def _set(param: torch.Tensor, value: float) -> None:
    with torch.no_grad():
        param.fill_(value)


def test_learned_scalars_dyt_derf():
    """Alphas and shifts set by hand; each site reports the mean over its DyT/Derf norms."""
    model, d = make("norm=derf", diag="default")
    for i, b in enumerate(model.blocks):
        _set(b.attn.norm_in.alpha, 0.1 * (i + 1))
        _set(b.attn.norm_in.shift, -0.5 * i)
        _set(b.mlp.norm_in.alpha, 2.0 + i)
        _set(b.mlp.norm_in.shift, 0.25)
    _set(model.ln_f.alpha, 7.0)
    _set(model.emb_scale.scale, 3.0)
    r = d.collect()
    assert approx(r["norm_alpha_attn"], [0.1, 0.2]) and approx(r["norm_shift_attn"], [0.0, -0.5])
    assert approx(r["norm_alpha_mlp"], [2.0, 3.0]) and approx(r["norm_shift_mlp"], [0.25, 0.25])
    assert approx(r["norm_alpha_final"], 7.0) and approx(r["embed_scale"], 3.0)

    model, d = make("arch=hybridnorm", "norm=dyt", diag="default")  # attention: only q/k/v norms
    for i, b in enumerate(model.blocks):
        core = b.attn.core
        assert b.attn.norm_in is None and b.attn.norm_post is None
        for j, norm in enumerate((core.q_norm, core.k_norm, core.v_norm)):
            _set(norm.alpha, 1.0 + j + 10 * i)
        _set(b.mlp.norm_in.alpha, 0.3)
    r = d.collect()
    assert approx(r["norm_alpha_attn"], [2.0, 12.0]) and approx(r["norm_alpha_mlp"], [0.3, 0.3])
    assert not any(k.startswith("norm_shift") for k in r)  # DyT has no shift
    assert not any(k.startswith(("norm_alpha_attn_", "norm_alpha_mlp_")) for k in r)  # one kind per sublayer

    # Peri-LN + q/k norms: input, output and q/k norms also reported apart
    model, d = make("arch=peri_ln", "norm=dyt", "arch.qk_norm=true", diag="default")
    for i, b in enumerate(model.blocks):
        _set(b.attn.norm_in.alpha, 1.0 + i)
        _set(b.attn.norm_out.alpha, 3.0)
        _set(b.attn.core.q_norm.alpha, 5.0)
        _set(b.attn.core.k_norm.alpha, 7.0)
        _set(b.mlp.norm_in.alpha, 0.5)
        _set(b.mlp.norm_out.alpha, 1.5 * i)
    r = d.collect()
    assert approx(r["norm_alpha_attn_in"], [1.0, 2.0]) and approx(r["norm_alpha_attn_out"], [3.0, 3.0])
    assert approx(r["norm_alpha_attn_qk"], [6.0, 6.0]) and approx(r["norm_alpha_attn"], [4.0, 4.25])
    assert approx(r["norm_alpha_mlp_in"], [0.5, 0.5]) and approx(r["norm_alpha_mlp_out"], [0.0, 1.5])
    assert "norm_alpha_attn_post" not in r


def test_learned_scalars_peri_ln_gains_and_ngpt():
    model, d = make("arch=peri_ln", diag="default")
    with torch.no_grad():
        model.blocks[1].attn.norm_out.weight.copy_(torch.linspace(0, 5, 64))  # mean 2.5
        model.blocks[0].mlp.norm_out.weight.fill_(0.5)
    r = d.collect()
    assert approx(r["out_norm_gain_attn"], [1.0, 2.5]) and approx(r["out_norm_gain_mlp"], [0.5, 1.0])
    assert not any(k.startswith(("norm_alpha", "ngpt")) for k in r)

    model, d = make("arch=ngpt", diag="default")
    b = model.blocks[1]
    with torch.no_grad():  # stored values: effective = param * init / scale
        b.attn_alpha.param.copy_(torch.linspace(-1, 1, 64) * b.attn_alpha.scale / b.attn_alpha.init)  # |.| mean
        b.sqk.param.fill_(2 * b.sqk.scale / b.sqk.init)
    r = d.collect()
    assert approx(r["ngpt_alpha_attn"][1], sum(abs(-1 + 2 * i / 63) for i in range(64)) / 64, rel=1e-5)
    assert approx(r["ngpt_sqk"][1], 2.0)


# -------------------------------------------------------- cost: one transfer
SYNCS = ("item", "tolist", "__float__", "__int__", "__bool__", "__index__", "cpu", "numpy")


def test_one_host_transfer_per_diagnostic_step(monkeypatch):
    model, d = make("arch=pre_ln", n_layer=3, diag="full")
    _, loss = model(d.batch[:, :-1], d.batch[:, 1:])
    loss.backward()
    d.collect()  # first call copies the batch and index tensors to the device once
    calls: list[str] = []
    for name in SYNCS:
        orig = getattr(torch.Tensor, name)

        def counted(self, *a, _orig=orig, _name=name, **kw):
            calls.append(_name)
            return _orig(self, *a, **kw)

        monkeypatch.setattr(torch.Tensor, name, counted)
    d.grad_norms()
    d.before_step()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.99)
    d.after_step()
    assert calls == []
    r = d.collect()
    monkeypatch.undo()
    assert calls == ["tolist"]
    assert ALL_DIAG <= set(r)  # everything came in that one transfer


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_no_device_sync_but_the_one_transfer_on_cuda():
    """CUDA's sync debug mode warns on every synchronizing call: the step adds none, collect exactly one."""
    model, d = make("arch=pre_ln", n_layer=4, diag="full")
    model.cuda()
    x = d.batch.cuda()
    _, loss = model(x[:, :-1], x[:, 1:])
    loss.backward()
    d.grad_norms(), d.before_step(), d.after_step(), d.collect()  # warm-up: one-time copies to the device
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            d.grad_norms()
            d.before_step()
            d.after_step()
            n_step = len(caught)
            r = d.collect()
            n_collect = len(caught) - n_step
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert n_step == 0, [str(w.message) for w in caught]
    assert n_collect == 1, [str(w.message) for w in caught]
    assert ALL_DIAG <= set(r)


# ----------------------------------------------------------- real tiny runs
def _run(tmp_path, *overrides: str) -> tuple[list[dict], dict]:
    cfg = compose([*TINY, "device=cpu", *overrides])
    summary = run(cfg, tmp_path)
    return read_jsonl(tmp_path / "metrics.jsonl"), summary


SCALAR_KEYS = {"logit_maxabs", "grad_norm_other", "ngpt_sz", "norm_alpha_final", "norm_alpha_embed", "embed_scale"}
LEARNED = {"norm_alpha_attn", "norm_alpha_mlp", "norm_shift_attn", "norm_shift_mlp", "norm_alpha_final"}
LEARNED |= {"norm_alpha_embed", "embed_scale", "out_norm_gain_attn", "out_norm_gain_mlp"}
LEARNED |= {"ngpt_alpha_attn", "ngpt_alpha_mlp", "ngpt_sqk", "ngpt_suv", "ngpt_sz"}
DYT = {"norm_alpha_attn", "norm_alpha_mlp", "norm_alpha_final", "embed_scale"}


@pytest.mark.parametrize(
    "overrides, extra",
    [
        (["arch=pre_ln", "diag=default"], set()),
        (["arch=post_ln", "norm=layernorm", "diag=full"], FULL_KEYS),
        (["arch=ngpt", "diag=full"], FULL_KEYS | {k for k in LEARNED if k.startswith("ngpt")}),
        (["arch=peri_ln", "diag=default"], {"out_norm_gain_attn", "out_norm_gain_mlp"}),
        (["norm=dyt", "diag=default"], DYT),
        (["norm=derf", "diag=full"], FULL_KEYS | DYT | {"norm_shift_attn", "norm_shift_mlp"}),
    ],
)
def test_metrics_jsonl_diag_records(tmp_path, overrides, extra):
    L = 3
    records, summary = _run(tmp_path, f"model.n_layer={L}", "trainer.max_steps=4", "diag.every=2", *overrides)
    assert summary["status"] == "completed" and summary["spikes"] == 0
    diag = [r for r in records if "var_resid" in r]
    assert [r["step"] for r in diag] == [1, 2, 4]  # the first step, then every diag.every steps
    for r in diag:
        keys = set(r) & (ALL_DIAG | LEARNED)
        assert keys == DEFAULT_KEYS | extra
        for k in keys:
            v = r[k]
            if k in SCALAR_KEYS:
                assert isinstance(v, float), k
            else:
                assert len(v) == (L + 1 if k in PER_RESID else L), k
            assert all(math.isfinite(x) for x in (v if isinstance(v, list) else [v])), k
        assert approx(r["grad_norm"] ** 2, sum(g * g for g in r["grad_norm_layer"]) + r["grad_norm_other"] ** 2, 1e-4)
        for a, m, lay in zip(r["grad_norm_attn"], r["grad_norm_mlp"], r["grad_norm_layer"]):
            assert approx(a * a + m * m, lay * lay, 1e-4)
        assert all(u > 0 for u in r["update_ratio_layer"])
        assert r["spikes"] == 0


def test_spikes_counted_and_recorded(tmp_path):
    # factor 0.5: every loss once the 4-loss window is full is a "spike"; steps 5..10
    records, summary = _run(
        tmp_path,
        "trainer.max_steps=10",
        "trainer.log_every=3",
        "diag=off",
        "diag.spike_factor=0.5",
        "diag.spike_window=4",
    )
    assert summary["spikes"] == 6
    assert [r["step"] for r in records] == [1, 3, 6, 9, 10]  # step 1: the first evaluation is always logged
    assert [r["spikes"] for r in records] == [0, 0, 2, 5, 6]
    assert [r.get("spike_steps") for r in records] == [None, None, [5, 6], [7, 8, 9], [10]]
    state = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=False)
    assert state["spikes"] == 6 and len(state["recent_losses"]) == 4
    assert state["recent_losses"][-1] == records[-1]["loss"]


HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


def _count_hooks(model: torch.nn.Module) -> int:
    n = sum(len(getattr(m, h, {}) or {}) for m in model.modules() for h in HOOK_DICTS)
    n += sum(p._backward_hooks is not None and len(p._backward_hooks) for p in model.parameters())
    import torch.nn.modules.module as mm

    n += sum(len(getattr(mm, g)) for g in dir(mm) if g.startswith("_global_") and g.endswith("hooks"))
    return n


@pytest.mark.parametrize("name", ["off", "full"])
def test_no_hooks_and_diag_off_never_runs(tmp_path, monkeypatch, name):
    from normbench.train import trainer as trainer_mod

    seen: dict = {}
    orig_fit = trainer_mod.Trainer.fit

    def fit(self):
        seen["before"] = _count_hooks(self.raw_model) + _count_hooks(self.model)
        out = orig_fit(self)
        seen["after"] = _count_hooks(self.raw_model) + _count_hooks(self.model)
        seen["stats"] = [b.attn.core.stats for b in self.raw_model.blocks]
        return out

    monkeypatch.setattr(trainer_mod.Trainer, "fit", fit)
    registered: list[str] = []
    for meth in ("register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook"):
        orig = getattr(torch.nn.Module, meth)

        def counted(self, *a, _orig=orig, _m=meth, **kw):
            registered.append(_m)
            return _orig(self, *a, **kw)

        monkeypatch.setattr(torch.nn.Module, meth, counted)
    calls: list[str] = []
    if name == "off":

        def forbidden(*a, **kw):
            calls.append("called")
            raise AssertionError("diagnostics ran with diag=off")

        for meth in ("grad_norms", "before_step", "after_step", "collect", "learned_scalars"):
            monkeypatch.setattr(Diagnostics, meth, forbidden)
        monkeypatch.setattr(diag_mod, "residual_stats", forbidden)
    records, summary = _run(tmp_path, "trainer.max_steps=6", f"diag={name}", "diag.every=2")
    assert summary["status"] == "completed" and calls == []
    assert seen["before"] == seen["after"] == 0 and registered == []
    assert seen["stats"] == [None, None]
    has_diag = [r["step"] for r in records if set(r) & ALL_DIAG]
    assert has_diag == ([] if name == "off" else [1, 2, 4, 6])


# ------------------------------------------------------ qualitative, real run
def test_pre_ln_variance_grows_with_depth_post_ln_stays_flat(tmp_path):
    """Depth 8, 60 steps of KJV bytes, seed 0: the Peri-LN paper's picture in miniature."""
    common = [
        "model.n_layer=8",
        "trainer.max_steps=60",
        "diag.every=60",
        "trainer.log_every=60",
        "trainer.eval_every=60",
    ]
    last = {}
    for arch in ("pre_ln", "post_ln"):
        records, summary = _run(tmp_path / arch, f"arch={arch}", *common)
        assert summary["status"] == "completed"
        last[arch] = [r for r in records if "var_resid" in r][-1]
        assert last[arch]["step"] == 60
    pre, post = last["pre_ln"]["var_resid"][1:], last["post_ln"]["var_resid"][1:]  # block outputs 1..8
    # Pre-LN: every block adds to the un-normalized stream
    assert all(b > a for a, b in zip(pre, pre[1:])), pre
    assert pre[-1] > 2.0 * pre[0], pre
    # Post-LN: every block output is normalized, variance ~1 at every depth
    assert all(0.8 < v < 1.25 for v in post), post
    assert max(post) / min(post) < 1.3, post
