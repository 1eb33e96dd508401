"""Block architectures against their equations (docs/architectures.md §3-4), written out here.

Every reference computation in this file is plain tensor code that reads the
model's weights by name and never calls the model's own sublayers: norms,
RoPE (as a complex rotation), causal attention (explicit mask + softmax), the
MLP and each arch's residual wiring. Parameters (norm gains included) are
randomized first, so a swapped norm or a wrong residual cannot hide behind
g = 1. Also here: RoPE invariants, the init rules (scaled, small, DeepNorm),
norm placement counts, nGPT's invariants and nanoGPT equivalence.
"""

from __future__ import annotations

import contextlib
import math

import pytest
import torch

from normbench.model import NANOGPT_SHAPE, build_model
from normbench.model.attention import apply_rope, rope_cache
from normbench.model.placement import deepnorm_alpha, deepnorm_beta, mix_ln_post_blocks
from normbench.norm.norms import Derf, DyT, LayerNorm, RMSNorm

from conftest import compose

NORMS = (LayerNorm, RMSNorm, DyT, Derf)
VOCAB = 256


def make(*overrides: str, vocab: int = VOCAB):
    torch.manual_seed(0)
    cfg = compose(["model=tiny", "model.d_model=32", "model.n_head=4", "model.seq_len=16", *overrides])
    return build_model(cfg, vocab), cfg


def randomize(model: torch.nn.Module, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.3, generator=g)
            elif "alpha" in name or "scale" in name:  # scalars of DyT/Derf, the embedding scalar
                p.uniform_(0.3, 1.2, generator=g)
            else:  # gains around 1, biases/shifts around 0
                base = 1.0 if name.endswith("weight") else 0.0
                p.copy_(base + 0.4 * torch.randn(p.shape, generator=g))


def known_input(B=2, T=7, d=32, seed=5):
    return torch.randn(B, T, d, generator=torch.Generator().manual_seed(seed)) * 1.5


# --------------------------------------------------------------------------- reference ops
_LENIENT = []  # non-empty inside lenient(): a missing norm counts as the identity


@contextlib.contextmanager
def lenient():
    """For selectivity checks only: apply another arch's equation to a block that lacks its norms."""
    _LENIENT.append(True)
    try:
        yield
    finally:
        _LENIENT.pop()


def ref_norm(mod, x):
    """The norm's equation from its parameters (docs/architectures.md §2); the spec puts a norm here."""
    if mod is None and _LENIENT:
        return x
    assert mod is not None, "the equation has a norm here, the model has none"
    w = getattr(mod, "weight", None)
    b = getattr(mod, "bias", None)
    if isinstance(mod, RMSNorm):
        y = x / torch.sqrt((x * x).mean(-1, keepdim=True) + mod.eps)
    elif isinstance(mod, LayerNorm):
        mu = x.mean(-1, keepdim=True)
        y = (x - mu) / torch.sqrt(((x - mu) ** 2).mean(-1, keepdim=True) + mod.eps)
    elif isinstance(mod, DyT):
        y = torch.tanh(mod.alpha * x)
    elif isinstance(mod, Derf):
        y = torch.erf(mod.alpha * x + mod.shift)
    else:
        raise AssertionError(f"unexpected norm {type(mod)}")
    if w is not None:
        y = y * w
    if b is not None:
        y = y + b
    return y


def ref_rope(x, theta=10000.0, offset=0):
    """x (B, T, H, hd): rotate the pair (x_i, x_{i+hd/2}) by angle t * theta^(-2i/hd), as a complex product."""
    T, hd = x.shape[1], x.shape[-1]
    half = hd // 2
    freq = theta ** (-2.0 * torch.arange(half, dtype=torch.float64) / hd)
    ang = (torch.arange(T, dtype=torch.float64) + offset)[:, None] * freq[None, :]  # (T, half)
    rot = torch.polar(torch.ones_like(ang), ang)[None, :, None, :]
    z = torch.complex(x[..., :half].double(), x[..., half:].double()) * rot
    return torch.cat([z.real, z.imag], dim=-1).to(x.dtype)


def linear(x, lin):
    y = x @ lin.weight.T
    return y + lin.bias if lin.bias is not None else y


def causal_softmax_attention(q, k, v, scale):
    """q, k, v (B, T, H, hd) -> (B, T, H*hd); explicit mask, no SDPA."""
    B, T, H, hd = q.shape
    att = torch.einsum("bthd,bshd->bhts", q, k) * scale
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    att = att.masked_fill(~mask, float("-inf")).softmax(-1)
    return torch.einsum("bhts,bshd->bthd", att, v).reshape(B, T, H * hd)


def ref_attention(x, core, n_head):
    """W_o softmax(RoPE(Nq q) RoPE(Nk k)^T / sqrt(d_h)) Nv v, q/k/v norms per head before RoPE."""
    B, T, C = x.shape
    hd = C // n_head
    q, k, v = linear(x, core.c_attn).split(C, dim=-1)
    q, k, v = (t.reshape(B, T, n_head, hd) for t in (q, k, v))
    norms = (core.q_norm, core.k_norm, core.v_norm)  # optional: arch.qk_norm, HybridNorm
    q, k, v = (t if norm is None else ref_norm(norm, t) for norm, t in zip(norms, (q, k, v)))
    q, k = ref_rope(q), ref_rope(k)
    return linear(causal_softmax_attention(q, k, v, 1.0 / math.sqrt(hd)), core.c_proj)


def ref_mlp(x, core):
    """SwiGLU: c_fc holds [up; gate]; c_proj(up * silu(gate))."""
    up, gate = linear(x, core.c_fc).chunk(2, dim=-1)
    return linear(up * gate * torch.sigmoid(gate), core.c_proj)


def parts(block, n_head):
    a, m = block.attn, block.mlp
    return (
        lambda h: ref_attention(h, a.core, n_head),
        lambda h: ref_mlp(h, m.core),
        a,
        m,
    )


def pre_block(x, block, n_head):
    A, Fm, a, m = parts(block, n_head)
    h = x + A(ref_norm(a.norm_in, x))
    return h + Fm(ref_norm(m.norm_in, h))


def post_block(x, block, n_head, alpha=1.0):
    A, Fm, a, m = parts(block, n_head)
    h = ref_norm(a.norm_post, alpha * x + A(x))
    return ref_norm(m.norm_post, alpha * h + Fm(h))


def peri_block(x, block, n_head):
    A, Fm, a, m = parts(block, n_head)
    h = x + ref_norm(a.norm_out, A(ref_norm(a.norm_in, x)))
    return h + ref_norm(m.norm_out, Fm(ref_norm(m.norm_in, h)))


def hybrid_block(x, block, n_head):
    A, Fm, a, m = parts(block, n_head)
    assert _LENIENT or None not in (a.core.q_norm, a.core.k_norm, a.core.v_norm), "HybridNorm normalizes q, k, v"
    y = x + A(x)  # no attention input norm; q/k/v norms inside A
    z = ref_norm(m.norm_in, y)
    return z + Fm(z)  # residual taken after the norm


def check_block(block, rope, x, expected):
    with torch.no_grad():
        got = block(x, rope)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------- equations
@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm", "dyt", "derf"])
@pytest.mark.parametrize("arch", ["pre_ln", "post_ln", "peri_ln"])
def test_block_equation_simple(arch, norm):
    model, cfg = make(f"arch={arch}", f"norm={norm}", "model.n_layer=1")
    randomize(model)
    x = known_input()
    block, H = model.blocks[0], cfg.model.n_head
    expected = {"pre_ln": pre_block, "post_ln": post_block, "peri_ln": peri_block}[arch](x, block, H)
    check_block(block, model.rope(x.device), x, expected)
    # sanity: the references differ from each other on this input (so the check is selective)
    with lenient():
        others = [f(x, block, H) for a, f in (("pre_ln", pre_block), ("hybridnorm", hybrid_block)) if a != arch]
    assert all((o - expected).abs().max() > 1e-2 for o in others if o.shape == expected.shape)


def test_pre_ln_qk_norm_equation():
    """arch.qk_norm: per-head norms over d_h on q and k (not v), before RoPE."""
    model, cfg = make("arch=pre_ln", "arch.qk_norm=true", "model.n_layer=1")
    randomize(model)
    core = model.blocks[0].attn.core
    assert core.q_norm.weight.shape == (8,) and core.k_norm.weight.shape == (8,) and core.v_norm is None
    x = known_input()
    check_block(model.blocks[0], model.rope(x.device), x, pre_block(x, model.blocks[0], cfg.model.n_head))
    # RoPE after the norm: norming after the rotation would give something else
    B, T, C = x.shape
    q = linear(x, core.c_attn)[..., :C].reshape(B, T, 4, 8)
    assert (ref_norm(core.q_norm, ref_rope(q)) - ref_rope(ref_norm(core.q_norm, q))).abs().max() > 1e-3


@pytest.mark.parametrize(
    "arch, n_layer, first, rest",
    [
        ("mix_ln", 4, post_block, pre_block),  # floor(0.25 * 4) = 1 Post-LN block, then Pre-LN
        # block 0: Pre-Norm plus q/k/v norm, the FFN residual is the pre-norm stream; then HybridNorm
        ("hybridnorm_star", 3, pre_block, hybrid_block),
    ],
)
def test_mixed_placements_first_block_then_the_rest(arch, n_layer, first, rest):
    model, cfg = make(f"arch={arch}", f"model.n_layer={n_layer}")
    randomize(model)
    x = known_input()
    rope, H = model.rope(x.device), cfg.model.n_head
    check_block(model.blocks[0], rope, x, first(x, model.blocks[0], H))
    for block in model.blocks[1:]:
        check_block(block, rope, x, rest(x, block, H))
    assert model.ln_f is not None  # both keep the final norm


@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
def test_hybridnorm_equation(norm):
    model, cfg = make("arch=hybridnorm", f"norm={norm}", "model.n_layer=2")
    randomize(model)
    x = known_input()
    rope, H = model.rope(x.device), cfg.model.n_head
    for block in model.blocks:
        check_block(block, rope, x, hybrid_block(x, block, H))
    # the tempting misreading Norm(Y + FFN(Y)) is something else
    A, Fm, a, m = parts(model.blocks[0], H)
    y = x + A(x)
    assert (ref_norm(m.norm_in, y + Fm(y)) - hybrid_block(x, model.blocks[0], H)).abs().max() > 1e-2


def test_deepnorm_equation_L12():
    model, cfg = make("arch=deepnorm", "model.n_layer=12")
    randomize(model)
    alpha = (2 * 12) ** 0.25
    assert alpha == pytest.approx(2.2134, abs=1e-4)
    x = known_input()
    rope, H = model.rope(x.device), cfg.model.n_head
    check_block(model.blocks[0], rope, x, post_block(x, model.blocks[0], H, alpha=alpha))
    check_block(model.blocks[7], rope, x, post_block(x, model.blocks[7], H, alpha=alpha))
    assert model.ln_f is None
    # alpha is overridable
    model2, _ = make("arch=deepnorm", "model.n_layer=12", "arch.alpha=1.7")
    randomize(model2)
    check_block(model2.blocks[0], rope, x, post_block(x, model2.blocks[0], H, alpha=1.7))


def test_peri_ln_embed_norm_and_full_forward():
    """One-block Peri-LN model end to end: N_emb(wte) -> block -> ln_f -> tied head."""
    model, cfg = make("arch=peri_ln", "arch.embed_norm=true", "model.n_layer=1")
    randomize(model)
    idx = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(2))
    wte = model.wte.weight
    x0 = ref_norm(model.emb_norm, wte[idx])
    h = peri_block(x0, model.blocks[0], cfg.model.n_head)
    logits = ref_norm(model.ln_f, h) @ wte.T
    with torch.no_grad():
        got, _ = model(idx)
    torch.testing.assert_close(got, logits, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "arch", ["pre_ln", "post_ln", "peri_ln", "mix_ln", "hybridnorm", "hybridnorm_star", "deepnorm", "ngpt"]
)
def test_bf16_autocast_forward_matches_fp32(arch):
    """Every arch runs under CPU bf16 autocast (mixed dtypes around q/k norms, RoPE, SDPA) close to fp32."""
    extra = ["arch.qk_norm=true"] if arch != "ngpt" else []
    model, _ = make(f"arch={arch}", "model.n_layer=4", *extra)
    idx = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits32, loss32 = model(idx[:, :-1], idx[:, 1:])
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits16, loss16 = model(idx[:, :-1], idx[:, 1:])
    assert torch.isfinite(logits16).all()
    assert loss16.item() == pytest.approx(loss32.item(), abs=5e-3)
    assert (logits16.float() - logits32).abs().max().item() < 0.1


# ---------------------------------------------------------------------------------- RoPE
def test_rope_is_a_rotation_with_relative_positions():
    hd, T = 16, 24
    cos, sin = rope_cache(T, hd, 10000.0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 2, T, hd, generator=g)  # (B, H, T, hd)
    y = apply_rope(x, cos, sin)
    # a rotation: norms preserved, position 0 untouched, other positions moved
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y[:, :, 0], x[:, :, 0])
    assert (y[:, :, 1:] - x[:, :, 1:]).abs().amax() > 1e-2
    # the same rotation as the complex-number formula
    torch.testing.assert_close(y, ref_rope(x.transpose(1, 2)).transpose(1, 2), rtol=1e-5, atol=1e-5)
    # relative positions: <R_m q, R_n k> depends only on m - n
    q, k = torch.randn(hd, generator=g), torch.randn(hd, generator=g)
    seq_q, seq_k = q.expand(1, 1, T, hd), k.expand(1, 1, T, hd)
    rq, rk = apply_rope(seq_q, cos, sin)[0, 0], apply_rope(seq_k, cos, sin)[0, 0]
    dots = rq @ rk.T  # dots[m, n]
    for m, n, s in [(5, 2, 7), (9, 1, 11), (3, 3, 20), (0, 4, 13)]:
        assert dots[m, n].item() == pytest.approx(dots[m + s, n + s].item(), abs=1e-4)
    assert abs(dots[5, 2].item() - dots[5, 3].item()) > 1e-3


# -------------------------------------------------------------------------- placement counts
def norm_count(module) -> int:
    return sum(isinstance(m, NORMS) for m in module.modules())


@pytest.mark.parametrize(
    "arch,extra,per_block,final,emb",
    [
        ("pre_ln", [], 2, True, False),
        ("pre_ln", ["arch.qk_norm=true"], 4, True, False),
        ("post_ln", [], 2, False, False),
        ("post_ln", ["arch.final_norm=true"], 2, True, False),
        ("peri_ln", [], 4, True, False),
        ("peri_ln", ["arch.embed_norm=true"], 4, True, True),
        ("mix_ln", [], 2, True, False),
        ("hybridnorm", [], 4, True, False),
        ("deepnorm", [], 2, False, False),
    ],
)
def test_norm_counts(arch, extra, per_block, final, emb):
    L = 3
    model, _ = make(f"arch={arch}", f"model.n_layer={L}", *extra)
    assert [norm_count(b) for b in model.blocks] == [per_block] * L
    assert (model.ln_f is not None) == final and (isinstance(model.ln_f, RMSNorm) or not final)
    assert (model.emb_norm is not None) == emb
    assert norm_count(model) == per_block * L + final + emb


def test_mix_ln_L12_post_blocks():
    assert mix_ln_post_blocks(12, 0.25) == 3 and mix_ln_post_blocks(24, 0.25) == 6
    model, _ = make("arch=mix_ln", "model.n_layer=12")
    post = {i for i, b in enumerate(model.blocks) if b.attn.norm_post is not None and b.mlp.norm_post is not None}
    pre = {i for i, b in enumerate(model.blocks) if b.attn.norm_in is not None and b.mlp.norm_in is not None}
    assert post == {0, 1, 2}
    assert pre == set(range(3, 12))
    model, _ = make("arch=mix_ln", "model.n_layer=8", "arch.post_ratio=0.5")
    assert {i for i, b in enumerate(model.blocks) if b.attn.norm_post is not None} == {0, 1, 2, 3}


def test_hybridnorm_star_structure():
    model, cfg = make("arch=hybridnorm_star", "model.n_layer=4")
    hd = cfg.model.d_model // cfg.model.n_head
    assert [b.attn.norm_in is not None for b in model.blocks] == [True, False, False, False]
    for b in model.blocks:
        for n in (b.attn.core.q_norm, b.attn.core.k_norm, b.attn.core.v_norm):
            assert isinstance(n, RMSNorm) and n.weight.shape == (hd,)
        assert b.mlp.norm_in is not None and b.attn.norm_post is None and b.mlp.norm_post is None
    assert [b.mlp.spec.residual_after_norm for b in model.blocks] == [False, True, True, True]


# --------------------------------------------------------------------------------- init rules
def std_of(w):
    return w.detach().double().std().item()


def trunc3_std_factor() -> float:
    """std of N(0,1) truncated to [-3, 3]."""
    phi = math.exp(-4.5) / math.sqrt(2 * math.pi)
    mass = math.erf(3 / math.sqrt(2))
    return math.sqrt(1 - 2 * 3 * phi / mass)


def test_deepnorm_coefficients():
    for L, a, b in [(12, 2.2134, 0.3195), (24, 2.6321, 0.2686), (32, 2.8284, 0.25)]:
        assert deepnorm_alpha(L) == pytest.approx(a, abs=1e-4)
        assert deepnorm_beta(L) == pytest.approx(b, abs=1e-4)


def test_deepnorm_init_std():
    """Paper init: xavier_normal(gain=beta) on v, out, FFN; gain 1 on q and k. std = gain*sqrt(2/(fan_in+fan_out))."""
    d, L = 256, 12
    model, cfg = make("arch=deepnorm", f"model.n_layer={L}", f"model.d_model={d}", "model.n_head=4")
    beta = 0.3195
    for block in (model.blocks[0], model.blocks[L - 1]):
        w = block.attn.core.c_attn.weight
        q, k, v = w[:d], w[d : 2 * d], w[2 * d :]
        xav = math.sqrt(2 / (d + d))
        assert std_of(q) == pytest.approx(xav, rel=0.02)
        assert std_of(k) == pytest.approx(xav, rel=0.02)
        assert std_of(v) == pytest.approx(beta * xav, rel=0.02)
        assert std_of(block.attn.core.c_proj.weight) == pytest.approx(beta * xav, rel=0.02)
        fc, proj = block.mlp.core.c_fc.weight, block.mlp.core.c_proj.weight
        d_ff = proj.shape[1]
        xav_ff = math.sqrt(2 / (d + d_ff))
        up, gate = fc[:d_ff], fc[d_ff:]  # two matrices of the SwiGLU FFN, each (d_ff, d)
        assert std_of(up) == pytest.approx(beta * xav_ff, rel=0.02)
        assert std_of(gate) == pytest.approx(beta * xav_ff, rel=0.02)
        assert std_of(proj) == pytest.approx(beta * xav_ff, rel=0.02)
        assert abs(w.detach().double().mean().item()) < 0.002
    # beta is overridable
    model, _ = make("arch=deepnorm", "model.n_layer=2", f"model.d_model={d}", "arch.beta=0.5")
    v = model.blocks[0].attn.core.c_attn.weight[2 * d :]
    assert std_of(v) == pytest.approx(0.5 * math.sqrt(1 / d), rel=0.02)


def test_pre_ln_scaled_init():
    d, L = 256, 4
    model, _ = make("arch=pre_ln", f"model.n_layer={L}", f"model.d_model={d}", "model.mlp=gelu")
    b = model.blocks[1]
    std = 0.02 * math.sqrt(768 / d)  # model.init_std: auto, GPT-2's gain at width d
    assert std_of(b.attn.core.c_attn.weight) == pytest.approx(std, rel=0.02)
    assert std_of(b.mlp.core.c_fc.weight) == pytest.approx(std, rel=0.02)
    assert std_of(b.attn.core.c_proj.weight) == pytest.approx(std / math.sqrt(2 * L), rel=0.02)
    assert std_of(b.mlp.core.c_proj.weight) == pytest.approx(std / math.sqrt(2 * L), rel=0.02)
    assert std_of(model.wte.weight) == pytest.approx(std, rel=0.03)


@pytest.mark.parametrize("arch", ["hybridnorm", "hybridnorm_star"])
def test_hybridnorm_small_init(arch):
    """OLMo full_megatron: std sqrt(2/(5d)) truncated at 3 std; output projections std/sqrt(2L); embedding std."""
    d, L = 256, 4
    model, _ = make(f"arch={arch}", f"model.n_layer={L}", f"model.d_model={d}")
    s = math.sqrt(2 / (5 * d))
    assert s == pytest.approx(0.0395, abs=1e-4)
    t = trunc3_std_factor()
    b = model.blocks[2]
    for w, sd in [
        (b.attn.core.c_attn.weight, s),
        (b.mlp.core.c_fc.weight, s),
        (b.attn.core.c_proj.weight, s / math.sqrt(2 * L)),
        (b.mlp.core.c_proj.weight, s / math.sqrt(2 * L)),
        (model.wte.weight, s),
    ]:
        assert std_of(w) == pytest.approx(sd * t, rel=0.025)
        assert w.abs().max().item() <= 3 * sd + 1e-7


# ------------------------------------------------------------------------------ nanoGPT
def nanogpt_forward(p: dict, idx: torch.Tensor, n_layer: int, n_head: int) -> torch.Tensor:
    """karpathy/nanoGPT model.py GPT.forward with targets (all positions), as plain tensor code."""

    def layer_norm(x, w, b):
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt(var + 1e-5) * w + b

    B, T = idx.shape
    x = p["transformer.wte.weight"][idx] + p["transformer.wpe.weight"][torch.arange(T)]
    for i in range(n_layer):
        pre = f"transformer.h.{i}."
        # CausalSelfAttention
        h = layer_norm(x, p[pre + "ln_1.weight"], p[pre + "ln_1.bias"])
        qkv = h @ p[pre + "attn.c_attn.weight"].T + p[pre + "attn.c_attn.bias"]
        C = x.shape[-1]
        q, k, v = qkv.split(C, dim=2)
        q, k, v = (t.view(B, T, n_head, C // n_head).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        bias = torch.tril(torch.ones(T, T)).view(1, 1, T, T)
        att = att.masked_fill(bias == 0, float("-inf"))
        att = torch.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + (y @ p[pre + "attn.c_proj.weight"].T + p[pre + "attn.c_proj.bias"])
        # MLP with exact GELU
        h = layer_norm(x, p[pre + "ln_2.weight"], p[pre + "ln_2.bias"])
        h = h @ p[pre + "mlp.c_fc.weight"].T + p[pre + "mlp.c_fc.bias"]
        h = 0.5 * h * (1.0 + torch.erf(h / math.sqrt(2.0)))
        x = x + (h @ p[pre + "mlp.c_proj.weight"].T + p[pre + "mlp.c_proj.bias"])
    x = layer_norm(x, p["transformer.ln_f.weight"], p["transformer.ln_f.bias"])
    return x @ p["transformer.wte.weight"].T  # lm_head tied to wte


def to_normbench(name: str) -> str:
    """nanoGPT parameter name -> normbench's."""
    name = name.removeprefix("transformer.")
    for a, b in [
        ("ln_1.", "attn.norm_in."),
        ("attn.c_", "attn.core.c_"),
        ("ln_2.", "mlp.norm_in."),
        ("mlp.c_", "mlp.core.c_"),
    ]:
        name = name.replace(a, b)
    return name.replace("h.", "blocks.", 1) if name.startswith("h.") else name


def test_nanogpt_equivalence():
    L, d, H, T, V = 2, 64, 4, 32, 96
    model, _ = make(
        *NANOGPT_SHAPE,
        f"model.n_layer={L}",
        f"model.d_model={d}",
        f"model.n_head={H}",
        f"model.seq_len={T}",
        vocab=V,
    )
    g = torch.Generator().manual_seed(7)
    shapes = {"transformer.wte.weight": (V, d), "transformer.wpe.weight": (T, d)}
    for i in range(L):
        pre = f"transformer.h.{i}."
        shapes.update(
            {
                pre + "ln_1.weight": (d,),
                pre + "ln_1.bias": (d,),
                pre + "attn.c_attn.weight": (3 * d, d),
                pre + "attn.c_attn.bias": (3 * d,),
                pre + "attn.c_proj.weight": (d, d),
                pre + "attn.c_proj.bias": (d,),
                pre + "ln_2.weight": (d,),
                pre + "ln_2.bias": (d,),
                pre + "mlp.c_fc.weight": (4 * d, d),
                pre + "mlp.c_fc.bias": (4 * d,),
                pre + "mlp.c_proj.weight": (d, 4 * d),
                pre + "mlp.c_proj.bias": (d,),
            }
        )
    shapes.update({"transformer.ln_f.weight": (d,), "transformer.ln_f.bias": (d,)})
    p = {}
    for name, shape in shapes.items():
        base = 1.0 if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or "ln_f.weight" in name else 0.0
        p[name] = base + 0.1 * torch.randn(shape, generator=g)
    # nanoGPT's parameter set is exactly ours (lm_head.weight is the tied wte)
    ours = {to_normbench(k): v for k, v in p.items()}
    ours["lm_head.weight"] = p["transformer.wte.weight"]
    assert set(ours) == set(model.state_dict())
    model.load_state_dict(ours, strict=True)
    assert model.lm_head.weight is model.wte.weight
    assert model.num_params() == sum(t.numel() for t in p.values())
    idx = torch.randint(0, V, (3, T), generator=g)
    with torch.no_grad():
        logits, _ = model(idx)
    expected = nanogpt_forward(p, idx, L, H)
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------- nGPT
def ngpt_make(*extra):
    return make("arch=ngpt", "model.n_layer=1", "model.d_model=32", "model.n_head=4", *extra)


def unit(v):
    return v / v.norm(dim=-1, keepdim=True)


def ref_ngpt_block(h, blk, n_head, d):
    """NVIDIA/ngpt model.py Block.forward, effective scales written from the stored parameters."""
    B, T, C = h.shape
    hd = C // n_head
    sd = math.sqrt(d)
    # stored value x (init / scale): alpha init 0.05 scale 1/sqrt(d); sqk 1, 1/sqrt(d); suv 1, 1
    alpha_a = blk.attn_alpha.param * (0.05 * sd)
    alpha_m = blk.mlp_alpha.param * (0.05 * sd)
    sqk = (blk.sqk.param * sd).view(1, 1, n_head, hd)
    suv = blk.suv.param * 1.0
    q, k, v = (h @ blk.c_attn.weight.T).split(C, dim=-1)
    q, k, v = (t.reshape(B, T, n_head, hd) for t in (q, k, v))
    q, k = ref_rope(q), ref_rope(k)  # RoPE first, then the per-head L2 norm
    q, k = sqk * unit(q), sqk * unit(k)
    y = causal_softmax_attention(q, k, v, math.sqrt(hd))  # softmax scale +sqrt(d_h)
    h_a = y @ blk.att_c_proj.weight.T
    h = unit(unit(h) + alpha_a.abs() * (unit(h_a) - unit(h)))
    uv = (h @ blk.c_fc.weight.T) * (suv * sd)
    u, g = uv.chunk(2, dim=-1)
    h_m = (u * g * torch.sigmoid(g)) @ blk.mlp_c_proj.weight.T
    return unit(unit(h) + alpha_m.abs() * (unit(h_m) - unit(h)))


def test_ngpt_init_effective_scales():
    model, cfg = ngpt_make("model.n_layer=2")
    d = cfg.model.d_model
    for blk in model.blocks:
        torch.testing.assert_close(blk.attn_alpha(), torch.full((d,), 0.05))
        torch.testing.assert_close(blk.mlp_alpha(), torch.full((d,), 0.05))
        torch.testing.assert_close(blk.sqk(), torch.ones(d))
        torch.testing.assert_close(blk.suv(), torch.ones(2 * 4 * d))
        # what Adam sees: the stored values
        torch.testing.assert_close(blk.attn_alpha.param, torch.full((d,), 1 / math.sqrt(d)))
        torch.testing.assert_close(blk.sqk.param, torch.full((d,), 1 / math.sqrt(d)))
        assert blk.c_fc.weight.shape == (2 * 4 * d, d)
    torch.testing.assert_close(model.sz(), torch.ones(VOCAB))
    torch.testing.assert_close(model.sz.param, torch.full((VOCAB,), 1 / math.sqrt(d)))
    assert model.lm_head.weight is not model.wte.weight  # never tied
    assert not any(isinstance(m, NORMS) for m in model.modules())


def test_ngpt_block_and_logits_equation():
    model, cfg = ngpt_make()
    d, H = cfg.model.d_model, cfg.model.n_head
    blk = model.blocks[0]
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():  # move the scale vectors off their init; alpha gets negative entries (abs is used)
        blk.attn_alpha.param.copy_(torch.randn(d, generator=g) / math.sqrt(d))
        blk.mlp_alpha.param.copy_(torch.randn(d, generator=g) / math.sqrt(d))
        blk.sqk.param.copy_((1 + 0.3 * torch.randn(d, generator=g)) / math.sqrt(d))
        blk.suv.param.copy_(1 + 0.3 * torch.randn(blk.suv.param.shape, generator=g))
        model.sz.param.copy_((1 + 0.3 * torch.randn(VOCAB, generator=g)) / math.sqrt(d))
    assert (blk.attn_alpha.param < 0).any()
    idx = torch.randint(0, VOCAB, (2, 11), generator=g)
    h0 = model.wte.weight[idx]
    h1 = ref_ngpt_block(h0, blk, H, d)
    expected = (model.sz.param * math.sqrt(d)) * (h1 @ model.lm_head.weight.T)  # no final norm
    hidden = []
    with torch.no_grad():
        logits, _ = model(idx, hidden=hidden)
    torch.testing.assert_close(hidden[1], h1, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)


def test_ngpt_unit_norms_after_optimizer_step():
    from normbench.optim.optimizers import build_optimizer

    torch.manual_seed(0)
    cfg = compose(["model=tiny", "arch=ngpt", "model.n_layer=2", "optim.lr=0.05", "optim.weight_decay=0"])
    model = build_model(cfg, VOCAB)
    opt = build_optimizer(model, cfg, log=lambda *a, **k: None)
    d = cfg.model.d_model

    def deviations():
        out = {}
        for name, w, dim in [
            ("wte", model.wte.weight, 1),
            ("lm_head", model.lm_head.weight, 1),
            *[(f"{i}.c_attn", b.c_attn.weight, 1) for i, b in enumerate(model.blocks)],
            *[(f"{i}.c_fc", b.c_fc.weight, 1) for i, b in enumerate(model.blocks)],
            *[(f"{i}.att_c_proj", b.att_c_proj.weight, 0) for i, b in enumerate(model.blocks)],
            *[(f"{i}.mlp_c_proj", b.mlp_c_proj.weight, 0) for i, b in enumerate(model.blocks)],
        ]:
            assert w.shape[dim] == d, name  # the unit vectors lie along the embedding dimension
            out[name] = (w.detach().norm(dim=dim) - 1).abs().max().item()
        return out

    assert max(deviations().values()) < 1e-3  # normalized at init
    idx = torch.randint(0, VOCAB, (4, 33), generator=torch.Generator().manual_seed(1))
    for _ in range(3):
        _, loss = model(idx[:, :-1], idx[:, 1:])
        loss.backward()
        opt.step()
        off = deviations()
        assert min(off.values()) > 1e-3, off  # the step does leave the sphere (the check can fail) ...
        model.after_step()
        opt.zero_grad(set_to_none=True)
        assert max(deviations().values()) < 1e-3  # ... and the re-projection brings every vector back
    # hidden states are unit norm after the embedding and after every block
    hidden = []
    with torch.no_grad():
        model(idx[:, :-1], hidden=hidden)
    assert len(hidden) == cfg.model.n_layer + 1
    for h in hidden:
        torch.testing.assert_close(h.norm(dim=-1), torch.ones(h.shape[:-1]), rtol=0, atol=1e-4)


@pytest.mark.parametrize("tie", [True, False])
def test_embed_init_std_holds_with_tied_and_untied_embeddings(tie):
    cfg = compose(["arch=mix_ln", "arch.embed_init_std=0.632", "model.d_model=256", f"model.tie_embeddings={tie}"])
    model = build_model(cfg, 512)
    assert abs(model.wte.weight.std().item() - 0.632) < 0.632 * 0.02
    block_std = model.blocks[0].attn.core.c_attn.weight.std().item()
    want = 0.02 * (768 / 256) ** 0.5  # the Linears keep model.init_std (auto at d_model 256)
    assert abs(block_std - want) < want * 0.05
