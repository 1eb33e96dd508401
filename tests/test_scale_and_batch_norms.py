"""The papers' further norm layers (norm/scale_and_batch_norms.py) and FixNorm (model.fixnorm).

Equations against hand-computed values in float64, init, the identities the papers state,
the causal leak of batch statistics (BatchNorm, PowerNorm's warmup) and its absence in the
causal-safe PowerNorm, parameter kinds and weight decay, one-line config errors, ``list norm``,
and a tiny model whose loss falls on pre_ln.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from normbench import cli
from normbench.errors import ConfigError
from normbench.model import build_model
from normbench.model.kinds import param_kinds
from normbench.norm.norms import build_norm
from normbench.norm.scale_and_batch_norms import BatchNormBT, CRMSNorm, PowerNorm, ScaleNorm, SeeDNorm
from normbench.optim.optimizers import build_optimizer
from normbench.validation import validate

from conftest import compose

F64 = torch.float64


# ------------------------------------------------------------------------------------------ ScaleNorm
def test_scalenorm_equation_init_and_eps_clamp():
    n = ScaleNorm(2).double()
    assert n.weight.shape == (1,) and n.weight.item() == pytest.approx(math.sqrt(2), rel=1e-7)  # one scalar, sqrt(d)
    g = n.weight.item()  # sqrt(2) as the fp32 parameter stores it
    y = n(torch.tensor([[3.0, 4.0]], dtype=F64))
    assert torch.allclose(y, torch.tensor([[0.6, 0.8]], dtype=F64) * g, atol=0, rtol=1e-15)
    # eps clamps the norm (1e-5), it is not added to the sum of squares
    tiny = torch.tensor([[3e-7, 4e-7]], dtype=F64)
    assert torch.allclose(n(tiny), tiny / 1e-5 * g, rtol=1e-14)
    y_big = n(torch.tensor([[3e-5, 4e-5]], dtype=F64))
    assert torch.allclose(y_big, torch.tensor([[0.6, 0.8]], dtype=F64) * g, rtol=1e-14)


def test_scalenorm_at_init_is_rmsnorm_without_gain_and_layernorm_on_zero_mean_input():
    d = 16
    x = torch.randn(3, 5, d, dtype=F64, generator=torch.Generator().manual_seed(0)) * 3
    x = x - x.mean(-1, keepdim=True)
    n = ScaleNorm(d).double()
    with torch.no_grad():
        n.weight.fill_(math.sqrt(d))  # exactly sqrt(d) in fp64
    y = n(x)
    assert torch.allclose(y, F.rms_norm(x, (d,), eps=0.0), rtol=1e-12)
    assert torch.allclose(y, F.layer_norm(x, (d,), eps=0.0), rtol=1e-12)


def test_scalenorm_affine_false_fixes_g():
    n = ScaleNorm(4, affine=False)
    assert not list(n.parameters())
    x = torch.tensor([1.0, 1.0, 1.0, 1.0], dtype=F64)
    assert torch.allclose(n(x), x)  # sqrt(4) * x / 2


# ------------------------------------------------------------------------------------------ CRMSNorm
def test_crmsnorm_equation_by_hand_and_layernorm_identity():
    n = CRMSNorm(2, eps=1e-5).double()
    assert not list(n.parameters())  # affine-free, as the reference
    x = torch.tensor([1.0, 2.0], dtype=F64)  # compressed z = [1, 2, -3]
    want = x / math.sqrt((1 + 4 + 9) / 3 + 1e-5)
    assert torch.allclose(n(x), want, rtol=1e-15)
    z = torch.randn(4, 7, 9, dtype=F64, generator=torch.Generator().manual_seed(4)) * 2
    z = z - z.mean(-1, keepdim=True)
    ln = F.layer_norm(z, (9,), eps=1e-5)
    assert torch.allclose(CRMSNorm(8, eps=1e-5).double()(z[..., :-1]), ln[..., :-1], rtol=1e-12)
    g = CRMSNorm(8, affine=True).double()
    with torch.no_grad():
        g.weight.copy_(torch.linspace(0.5, 1.5, 8))
    assert torch.allclose(g(z[..., :-1]), ln[..., :-1] * g.weight, rtol=1e-12)


@pytest.mark.parametrize("affine", [False, True])
def test_pre_crmsnorm_gpt_is_exactly_a_pre_ln_gpt_one_coordinate_wider(affine):
    """norm=crmsnorm (width d) computes the logits of a Pre-LN model with a zero-mean residual of width d + 1:
    embeddings [E, -sum E], input projections [W, 0], output projections [W; -sum of rows], head [E, 0]."""
    cfg = compose(["model=tiny", "arch=pre_ln", "norm=crmsnorm", f"norm.affine={str(affine).lower()}"])
    torch.manual_seed(0)
    model = build_model(cfg, 64).double()
    norms = [b.attn.norm_in for b in model.blocks] + [b.mlp.norm_in for b in model.blocks] + [model.ln_f]
    assert all(isinstance(m, CRMSNorm) for m in norms)
    if affine:  # a trained gain: the wide model's LayerNorm gain is [g, anything]
        with torch.no_grad():
            for i, m in enumerate(norms):
                m.weight.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(i))
    d = cfg.model.d_model
    idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        logits, _ = model(idx)

        def expand(y):
            return torch.cat([y, -y.sum(-1, keepdim=True)], -1)

        def ln(z, m):  # LayerNorm at width d + 1 (eps 1e-5), its gain's first d entries = the CRMSNorm gain
            y = F.layer_norm(z, (d + 1,), eps=1e-5)[..., :d]
            return y * m.weight if affine else y

        rope = model.rope(idx.device, F64)
        z = expand(model.wte(idx))
        for b in model.blocks:
            z = z + expand(b.attn.core(ln(z, b.attn.norm_in), rope))
            z = z + expand(b.mlp.core(ln(z, b.mlp.norm_in)))
        assert z.sum(-1).abs().max() < 1e-10  # the wide residual stays zero-mean
        ref = ln(z, model.ln_f) @ model.wte.weight.T
    assert torch.allclose(logits, ref, rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------------------------------ SeeDNorm
def test_seednorm_equation_by_hand():
    n = SeeDNorm(4, eps=1e-6).double()
    with torch.no_grad():
        n.seed_beta.copy_(torch.tensor([0.5, 0.0, 0.0, 0.25]))
        n.seed_alpha.fill_(2.0)
        n.weight.copy_(torch.tensor([1.0, 0.5, 1.0, 1.0]))
    x = torch.tensor([1.0, -1.0, 2.0, 0.0], dtype=F64)
    seed = 0.5 * 1.0 + 0.25 * 0.0  # <x, beta> from the raw x
    rms = math.sqrt((1 + 1 + 4 + 0) / 4 + 1e-6)
    gamma = [1.0, 0.5, 1.0, 1.0]
    want = [(math.tanh(seed) * 2.0 + g) * xi / rms for g, xi in zip(gamma, [1.0, -1.0, 2.0, 0.0])]
    assert torch.allclose(n(x), torch.tensor(want, dtype=F64), rtol=1e-14)


def test_seednorm_multihead_seeds_per_slice():
    n = SeeDNorm(4, eps=0.0, heads=2).double()
    with torch.no_grad():
        n.seed_beta.copy_(torch.tensor([1.0, 0.0, 0.0, 1.0]))
    x = torch.tensor([0.3, 2.0, 5.0, -0.7], dtype=F64)
    rms = math.sqrt(sum(v * v for v in x.tolist()) / 4)
    s = [math.tanh(0.3), math.tanh(-0.7)]  # slice 0 sees x0, slice 1 sees x3
    want = [(s[i // 2] + 1.0) * v / rms for i, v in enumerate(x.tolist())]
    assert torch.allclose(n(x), torch.tensor(want, dtype=F64), rtol=1e-14)


def test_seednorm_at_init_is_rmsnorm_and_only_beta_learns_first():
    d = 8
    n = SeeDNorm(d, eps=1e-6).double()
    assert (n.weight == 1).all() and (n.seed_alpha == 1).all() and (n.seed_beta == 0).all()
    x = torch.randn(4, d, dtype=F64, generator=torch.Generator().manual_seed(1))
    y = n(x)
    assert torch.equal(y, y) and torch.allclose(y, F.rms_norm(x, (d,), eps=1e-6), rtol=1e-14)
    (y * torch.randn_like(y)).sum().backward()
    assert n.seed_alpha.grad.abs().max() == 0  # tanh(0) = 0
    assert n.seed_beta.grad.abs().max() > 0


def test_seednorm_seed_final_false_keeps_rmsnorm_at_the_final_site_only():
    from normbench.norm.norms import RMSNorm

    for final in (True, False):
        model = build_model(compose(["model=tiny", "norm=seednorm", f"norm.seed_final={str(final).lower()}"]), 256)
        assert type(model.ln_f) is (SeeDNorm if final else RMSNorm)
        assert all(isinstance(b.attn.norm_in, SeeDNorm) and isinstance(b.mlp.norm_in, SeeDNorm) for b in model.blocks)


# --------------------------------------------------------------------------------- BatchNorm / PowerNorm
def _seq(seed=2, B=2, T=6, C=8):
    return torch.randn(B, T, C, dtype=F64, generator=torch.Generator().manual_seed(seed)) * 2 + 0.3


def _future_changes_past(norm, x) -> float:
    """Largest change of outputs at positions < 4 when position 4 of sequence 0 is perturbed (train mode)."""
    a, b = copy.deepcopy(norm).train(), copy.deepcopy(norm).train()
    x2 = x.clone()
    x2[0, 4] += 5.0
    return (a(x)[:, :4] - b(x2)[:, :4]).abs().max().item()


def test_batchnorm_equation_and_its_causal_leak():
    x = _seq()
    n = BatchNormBT(8).double()
    scaled = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)  # per-token RMS scaling first
    flat = scaled.reshape(-1, 8)
    mean, var = flat.mean(0), flat.var(0, unbiased=False)
    want = (scaled - mean) / torch.sqrt(var + 1e-5)
    assert torch.allclose(n(x), want, rtol=1e-12)
    assert torch.allclose(n.running_mean, 0.05 * mean, rtol=1e-12)  # momentum 0.05 from 0
    assert _future_changes_past(BatchNormBT(8).double(), x) > 1e-3  # the leak the config refuses
    n.eval()
    assert _future_changes_past(n, x) > 1e-3  # (train-mode copies)
    x2 = x.clone()
    x2[0, 4] += 5.0
    assert torch.equal(n(x)[:, :4], n(x2)[:, :4])  # eval uses running statistics only


def test_powernorm_forward_uses_running_phi_then_updates_it():
    x = _seq()
    n = PowerNorm(8, groups=2).double()
    with torch.no_grad():
        n.running_phi.fill_(4.0)
    xg = x.unflatten(-1, (2, 4))
    scaled = (xg / torch.sqrt(xg.pow(2).mean(-1, keepdim=True) + 1e-5)).flatten(-2)  # group scaling
    y = n(x)
    assert torch.allclose(y, scaled / math.sqrt(4.0 + 1e-5), rtol=1e-12)  # the old phi, not the batch's
    psi2 = scaled.reshape(-1, 8).pow(2).mean(0)
    assert torch.allclose(n.running_phi, 0.9 * 4.0 + 0.1 * psi2, rtol=1e-12)
    n.eval()
    assert torch.allclose(n(x), scaled / torch.sqrt(n.running_phi + 1e-5), rtol=1e-12)


def test_powernorm_approximate_backward_by_hand():
    x = _seq().requires_grad_(True)
    n = PowerNorm(8).double()
    with torch.no_grad():
        n.weight.copy_(torch.linspace(0.5, 2.0, 8))
        n.ema_gz.fill_(0.3)
    up = torch.randn(2, 6, 8, dtype=F64, generator=torch.Generator().manual_seed(3))
    (n(x) * up).sum().backward()
    s = torch.sqrt(x.detach().pow(2).mean(-1, keepdim=True) + 1e-5)
    scaled = x.detach() / s
    z = scaled / math.sqrt(1.0 + 1e-5)  # running_phi = 1 at init
    psi2 = scaled.reshape(-1, 8).pow(2).mean(0)
    g = up * n.weight.detach()
    approx = g - 0.1 * 0.3 * z
    d_scaled = approx / torch.sqrt(psi2 + 1e-5)  # the batch's psi2 although the forward used phi
    # chain through the (exact) per-token scaling x / s
    d_x = d_scaled / s - x.detach() * (d_scaled * x.detach()).sum(-1, keepdim=True) / (8 * s**3)
    assert torch.allclose(x.grad, d_x, rtol=1e-10)
    assert torch.allclose(n.ema_gz, 0.3 + (approx * z).reshape(-1, 8).mean(0), rtol=1e-12)
    assert torch.allclose(n.weight.grad, (up * z).sum((0, 1)), rtol=1e-12)
    assert torch.allclose(n.bias.grad, up.sum((0, 1)), rtol=1e-12)


def test_powernorm_is_causal_safe_and_its_reference_warmup_is_not():
    x = _seq()
    assert _future_changes_past(PowerNorm(8).double(), x) == 0.0
    assert _future_changes_past(PowerNorm(8, warmup=2).double(), x) > 1e-3


# -------------------------------------------------------------------------------------------- FixNorm
def test_fixnorm_unit_embeddings_and_cosine_logits():
    cfg = compose(["model=tiny", "norm=scalenorm", "model.fixnorm=true", "model.pos=rope"])
    torch.manual_seed(0)
    model = build_model(cfg, 256).double()
    idx = torch.randint(0, 256, (2, 8))
    d = cfg.model.d_model
    hidden = []
    logits, _ = model(idx, hidden=hidden)
    E = model.wte.weight.detach()
    assert torch.allclose(hidden[0], E[idx] / E[idx].norm(dim=-1, keepdim=True) * math.sqrt(d), rtol=1e-12)
    with torch.no_grad():
        model.ln_f.weight.fill_(7.0)  # the final ScaleNorm's g is the cosine classifier's temperature
        logits, _ = model(idx)
        rope = model.rope(idx.device, F64)
        h = model.blocks[1](model.blocks[0](model.embed(idx), rope), rope)
    cos = F.normalize(h, dim=-1) @ F.normalize(E, dim=-1).T
    assert torch.allclose(logits, 7.0 * cos, rtol=1e-10, atol=1e-12)


# -------------------------------------------------------------------------------- kinds and weight decay
NEW = ["norm=scalenorm", "norm=seednorm", "norm=powernorm", "norm=batchnorm", "norm=crmsnorm"]


@pytest.mark.parametrize("norm", NEW)
def test_kinds_and_weight_decay(norm):
    cfg = compose(
        [
            "model=tiny",
            "arch=peri_ln",
            norm,
            "norm.affine=true",
            "optim.decay_norm_out=true",
            "optim.decay_scalars=true",
        ]
    )
    torch.manual_seed(0)
    model = build_model(cfg, 256)
    kinds = param_kinds(model)
    assert kinds["blocks.0.attn.norm_in.weight"] == "norm_in" and kinds["ln_f.weight"] == "norm_in"
    assert kinds["blocks.1.mlp.norm_out.weight"] == "norm_out"
    if norm == "norm=seednorm":
        assert kinds["blocks.0.attn.norm_in.seed_alpha"] == kinds["blocks.0.mlp.norm_out.seed_beta"] == "scalar"
    if norm in ("norm=powernorm", "norm=batchnorm"):
        assert kinds["blocks.0.attn.norm_in.bias"] == "bias"
    opt = build_optimizer(model, cfg, log=lambda *_: None)
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    params = dict(model.named_parameters())
    assert id(params["blocks.1.mlp.norm_out.weight"]) in decayed  # norm_out decayed by the policy
    assert id(params["blocks.0.attn.norm_in.weight"]) not in decayed  # norm_in is not
    if norm == "norm=seednorm":  # the paper decays alpha and beta: optim.decay_scalars=true does
        assert id(params["blocks.0.attn.norm_in.seed_beta"]) in decayed


# ------------------------------------------------------------------------------------------ config errors
@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["norm=batchnorm"], "norm.allow_leak=true"),
        (["norm=powernorm", "norm.pn_warmup=10"], "norm.pn_warmup=10"),
        (["norm=powernorm", "norm.pn_groups=3"], "norm.pn_groups=3"),
        (["norm=powernorm", "norm.pn_alpha_fwd=1.5"], "norm.pn_alpha_fwd=1.5"),
        (["norm=batchnorm", "norm.allow_leak=true", "arch.qk_norm=true"], "arch.qk_norm=head"),
        (["norm=seednorm", "norm.seed_heads=3"], "norm.seed_heads=3"),
        (["norm=seednorm", "norm.seed_heads=0"], "norm.seed_heads=0"),
        (["norm=seednorm", "norm.affine=false"], "norm.affine=false"),
        (["norm=crmsnorm", "arch.qk_norm=true"], "arch.qk_norm=head"),
        (["norm=crmsnorm", "arch.qk_norm=width"], "arch.qk_norm=width"),
        (["norm=crmsnorm", "arch=hybridnorm"], "arch=hybridnorm"),
    ],
)
def test_bad_values_are_one_line(capsys, overrides, needle):
    with pytest.raises(ConfigError, match=r"^[^\n]*$") as exc:
        validate(compose(["model=tiny", *overrides]))
    assert needle in str(exc.value)
    capsys.readouterr()
    assert cli.main(["train", "model=tiny", *overrides, "trainer.max_steps=1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and err[0].startswith("normbench: error: ")


def test_leak_allowed_and_causal_powernorm_validate():
    validate(compose(["model=tiny", "norm=batchnorm", "norm.allow_leak=true"]))
    validate(compose(["model=tiny", "norm=powernorm", "norm.pn_warmup=5", "norm.allow_leak=true"]))
    validate(compose(["model=tiny", "norm=powernorm", "norm.pn_groups=4"]))


def test_list_norm_shows_each_with_its_paper(capsys):
    assert cli.main(["list", "norm"]) == 0
    out = capsys.readouterr().out
    for name, paper in [
        ("scalenorm", "arXiv:1910.05895"),
        ("crmsnorm", "arXiv:2305.14858"),
        ("seednorm", "arXiv:2510.22777"),
        ("batchnorm", "Shen et al. 2020"),
        ("powernorm", "arXiv:2003.07845"),
    ]:
        line = next(line for line in out.splitlines() if line.split()[:1] == [name])
        assert paper in line, line


def test_builders_follow_config():
    n = compose(["norm=powernorm", "norm.pn_groups=4", "norm.pn_alpha_fwd=0.8"]).norm
    pn = build_norm(n, 64, "ffn")
    assert isinstance(pn, PowerNorm) and pn.groups == 4 and pn.alpha_fwd == 0.8 and pn.warmup == 0
    sd = build_norm(compose(["norm=seednorm", "norm.seed_heads=2"]).norm, 64, "attn")
    assert isinstance(sd, SeeDNorm) and sd.heads == 2 and sd.eps == 1e-6


# ------------------------------------------------------------------------------------------ training
@pytest.mark.parametrize(
    "overrides",
    [[n] for n in NEW if n != "norm=batchnorm"]
    + [["norm=batchnorm", "norm.allow_leak=true"], ["norm=scalenorm", "model.fixnorm=true"]],
)
def test_tiny_model_learns(overrides):
    cfg = compose(["model=tiny", "arch=pre_ln", "model.seq_len=32", *overrides])
    torch.manual_seed(0)
    model = build_model(cfg, 64)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    start = torch.randint(0, 64, (8, 1), generator=gen)
    data = (start + torch.arange(33)) % 64  # a learnable pattern: the next token is the previous + 1
    losses = []
    for _ in range(25):
        _, loss = model(data[:, :-1], data[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 1.0, losses
