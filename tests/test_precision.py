"""Exact at every precision (docs/architectures.md, "Precision").

fp64 inputs are computed in fp64 end to end: the statistic norms, the RoPE table, nGPT's L2
normalizations and the loss. A float64 model passes ``torch.autograd.gradcheck`` (finite
differences at 1e-6 agree with autograd), which any silent round trip through fp32 breaks.
fp32 and bf16 keep their fp32 statistics and fp32 RoPE table bit for bit.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from normbench.model import build_model
from normbench.model.attention import apply_rope, rope_cache
from normbench.norm.norms import LayerNorm, RMSNorm, upcast

from conftest import compose

D = 24


def _x(*shape, dtype=torch.float64, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * 3.0 + 0.5).to(dtype)


def _gains(mod: torch.nn.Module) -> None:
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in mod.parameters():
            p.copy_(1.0 + 0.5 * torch.randn(p.shape, generator=g, dtype=torch.float64))


def test_upcast_promotes_to_at_least_fp32():
    for dtype, want in [
        (torch.bfloat16, torch.float32),
        (torch.float16, torch.float32),
        (torch.float32, torch.float32),
        (torch.float64, torch.float64),
    ]:
        assert upcast(torch.zeros(2, dtype=dtype)).dtype == want
    x = torch.ones(3)
    assert upcast(x) is x  # fp32: no copy, the fp32 path is untouched


def test_layernorm_and_rmsnorm_exact_in_fp64():
    """The textbook formulas in fp64 agree to 1e-13; a norm that reduced in fp32 is off by ~1e-7."""
    x = _x(4, 5, D)
    ln, rms = LayerNorm(D, eps=1e-5).double(), RMSNorm(D, eps=1e-6).double()
    _gains(ln)
    _gains(rms)
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    want_ln = (x - mean) / torch.sqrt(var + 1e-5) * ln.weight + ln.bias
    want_rms = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6) * rms.weight
    got_ln, got_rms = ln(x), rms(x)
    assert got_ln.dtype == got_rms.dtype == torch.float64
    torch.testing.assert_close(got_ln, want_ln, rtol=0, atol=1e-13)
    torch.testing.assert_close(got_rms, want_rms, rtol=0, atol=1e-13)
    # selective: the same formula with statistics in fp32 misses that tolerance by far
    lossy = F.rms_norm(x.float(), (D,), eps=1e-6).double() * rms.weight
    assert (lossy - want_rms).abs().max().item() > 1e-9


def test_rope_table_exact_in_fp64_and_unchanged_in_fp32():
    T, hd, theta = 4096, 16, 10000.0
    cos, sin = rope_cache(T, hd, theta, dtype=torch.float64)
    assert cos.dtype == sin.dtype == torch.float64
    i = torch.arange(hd // 2, dtype=torch.float64)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * theta ** (-2.0 * i / hd)[None, :]
    want = torch.cat([ang, ang], dim=-1)
    torch.testing.assert_close(cos, want.cos(), rtol=0, atol=1e-12)
    torch.testing.assert_close(sin, want.sin(), rtol=0, atol=1e-12)
    # a rotation in fp64: norms preserved to fp64 precision at the far positions too
    x = _x(1, 2, T, hd)
    torch.testing.assert_close(apply_rope(x, cos, sin).norm(dim=-1), x.norm(dim=-1), rtol=1e-13, atol=0)
    # fp32 (and bf16, which uses the fp32 table) unchanged: the fp32 formula, bit for bit
    c32, s32 = rope_cache(T, hd, theta)
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    f32 = torch.outer(torch.arange(T, dtype=torch.float32), inv)
    assert c32.dtype == torch.float32
    assert torch.equal(c32, torch.cat([f32, f32], -1).cos()) and torch.equal(s32, torch.cat([f32, f32], -1).sin())
    # and the fp32 table is measurably off at position 4095 (what fp64 fixes)
    assert (c32.double() - want.cos()).abs().max().item() > 1e-6


def test_model_rope_table_follows_the_weights_dtype():
    cfg = compose(["model=tiny", "model.d_model=16", "model.n_head=2", "model.seq_len=8"])
    model = build_model(cfg, 32)
    assert model.rope(torch.device("cpu"), torch.bfloat16)[0].dtype == torch.float32
    model.double()
    model(torch.zeros(1, 8, dtype=torch.long))
    assert model._rope[0].dtype == torch.float64


@pytest.mark.parametrize(
    "overrides",
    [
        ["arch=pre_ln", "norm=rmsnorm"],
        ["arch=peri_ln", "norm=layernorm", "arch.qk_norm=true"],
        ["arch=ngpt"],
    ],
    ids=["pre_ln-rmsnorm", "peri_ln-layernorm-qk", "ngpt"],
)
def test_fp64_model_passes_gradcheck(overrides):
    """Finite differences (eps 1e-6) match autograd in fp64 through norms, RoPE and the loss.

    Any op that rounds through fp32 adds ~1e-7 noise per evaluation, i.e. ~0.1 error on a
    finite-difference gradient, and gradcheck fails.
    """
    torch.manual_seed(0)
    small = ["model=tiny", "model.n_layer=1", "model.d_model=16", "model.n_head=2", "model.seq_len=8"]
    cfg = compose([*small, *overrides])
    model = build_model(cfg, 32).double()
    idx = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(3))
    names = [n for n, p in model.named_parameters() if p.ndim == 1 and p.numel() <= 32][:2]
    assert names, "a small parameter to differentiate"
    base = dict(model.named_parameters())
    inputs = tuple(base[n].detach().clone().requires_grad_(True) for n in names)

    def loss(*ps):
        return functional_call(model, {**base, **dict(zip(names, ps))}, (idx, idx))[1]

    assert loss(*inputs).dtype == torch.float64
    assert torch.autograd.gradcheck(loss, inputs, eps=1e-6, atol=1e-7, rtol=1e-5)
    assert math.isfinite(loss(*inputs).item())
