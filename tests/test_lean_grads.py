"""The lean-backward norms give autograd's composite's bits: outputs, input and gain gradients."""

import pytest
import torch
import torch.nn.functional as F

from normbench.norm.lean_grads import l2_normalize, rms_norm


def _grads(norm_fn, x0, w0, shape_fn):
    """Gradients of a graph where x also feeds a matmul created before the norm and a residual after it."""
    x = x0.clone().requires_grad_()
    w = None if w0 is None else w0.clone().requires_grad_()
    mixer = torch.linspace(-1, 1, x0.shape[-1] ** 2).view(x0.shape[-1], -1)
    side = x @ mixer  # created before the norm: its gradient reaches x last
    y = norm_fn(shape_fn(x), w)
    out = (y.reshape(x.shape) + x) * side  # the residual: created after, its gradient arrives first
    out.backward(torch.cos(torch.arange(out.numel(), dtype=out.dtype)).view(out.shape))
    return y.detach(), x.grad, None if w is None else w.grad


@pytest.mark.parametrize("affine", [True, False])
def test_rms_norm_matches_f_rms_norm_bit_for_bit(affine):
    torch.manual_seed(0)
    x0, w0 = torch.randn(4, 16, 32) * 3, (torch.rand(32) + 0.5 if affine else None)
    ours = _grads(lambda x, w: rms_norm(x, w, 1e-6), x0, w0, lambda x: x)
    ref = _grads(lambda x, w: F.rms_norm(x, (32,), w, 1e-6), x0, w0, lambda x: x)
    for a, b in zip(ours, ref):
        assert (a is None and b is None) or torch.equal(a, b)
    assert ours[1].abs().sum() > 0  # gradients flowed


@pytest.mark.parametrize("transposed", [False, True])
def test_l2_normalize_matches_f_normalize_bit_for_bit(transposed):
    torch.manual_seed(1)
    x0 = torch.randn(2, 24, 32) * 2
    x0[0, 3] = 1e-9  # a row under eps: the clamp's zero gradient path
    # as nGPT's q and k: (B, T, H, hd) viewed as (B, H, T, hd), not contiguous
    shape = (lambda x: x.view(2, 24, 4, 8).transpose(1, 2)) if transposed else (lambda x: x)
    ours = _grads(lambda x, w: l2_normalize(x, 1e-6), x0, None, shape)
    ref = _grads(lambda x, w: F.normalize(x, dim=-1, eps=1e-6), x0, None, shape)
    assert torch.equal(ours[0], ref[0]) and torch.equal(ours[1], ref[1])


def test_lean_norms_fall_back_to_the_composites_without_grad_or_in_fp64():
    x32 = torch.randn(3, 8, requires_grad=True)  # eager fp32 CPU: the lean Functions
    assert l2_normalize(x32, 1e-6).grad_fn.name() == "_L2NormalizeBackward"
    assert rms_norm(x32, None, 1e-6).grad_fn.name() == "_RMSNormBackward"
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast casts per op: the composite
        assert rms_norm(x32, None, 1e-6).grad_fn.name() != "_RMSNormBackward"
    x = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    assert l2_normalize(x, 1e-6).grad_fn.name() == "DivBackward0"  # fp64: the composite
    with torch.no_grad():
        y = rms_norm(torch.randn(3, 8), None, 1e-6)
    assert torch.allclose(y.pow(2).mean(-1), torch.ones(3), atol=1e-5)


@pytest.mark.parametrize("arch", ["pre_ln", "peri_ln", "hybridnorm", "ngpt"])
def test_models_get_the_composites_gradients_bit_for_bit(arch, monkeypatch):
    """Whole models, where the norms' inputs also feed residuals and projections: every gradient equal."""
    from normbench.model import build_model
    from normbench.norm import lean_grads

    from conftest import compose

    cfg = compose([f"arch={arch}", "norm=rmsnorm", "model=tiny"])
    idx = torch.randint(0, 64, (2, 33), generator=torch.Generator().manual_seed(0))

    def grads():
        torch.manual_seed(0)
        model = build_model(cfg, 64)
        _, loss = model(idx[:, :-1], idx[:, 1:])
        loss.backward()
        return loss.detach(), {n: p.grad for n, p in model.named_parameters()}

    lean_loss, lean = grads()
    monkeypatch.setattr(lean_grads, "_eager_fp32", lambda x: False)  # F.normalize / F.rms_norm throughout
    ref_loss, ref = grads()
    assert torch.equal(lean_loss, ref_loss)
    assert lean.keys() == ref.keys() and all(torch.equal(lean[n], ref[n]) for n in ref), [
        n for n in ref if not torch.equal(lean[n], ref[n])
    ]
