"""Norm layers against their equations (docs/architectures.md §2), written out here.

LayerNorm/RMSNorm are compared with ``torch.nn.functional`` (also under bf16
autocast on CPU, where the statistics must stay fp32); DyT/Derf with
``g * tanh(a x) + b`` and ``g * erf(a x + s) + b``; the per-site alpha init and
the DyT/Derf embedding scalar are checked on built models.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from normbench.errors import ConfigError
from normbench.model import build_model, check_combination
from normbench.norm.norms import Derf, DyT, LayerNorm, RMSNorm, alpha_rule, build_norm
from normbench.validation import prepare, validate

from conftest import compose

D = 48


def _randomize(mod: torch.nn.Module, seed: int = 0) -> None:
    """Non-trivial gains/biases/scalars so a wrong formula cannot hide behind g=1, b=0."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in mod.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5 + (1.0 if p.dim() else 0.0))


def _x(*shape, seed=1, scale=3.0, offset=0.5):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale + offset


# ------------------------------------------------------------------ LayerNorm / RMSNorm
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("affine", [True, False])
def test_layernorm_matches_functional(affine, bias):
    ln = LayerNorm(D, eps=1e-5, affine=affine, bias=bias)
    _randomize(ln)
    x = _x(4, 7, D)
    w = ln.weight if affine else None
    b = ln.bias if (affine and bias) else None
    torch.testing.assert_close(ln(x), F.layer_norm(x, (D,), w, b, eps=1e-5), rtol=1e-6, atol=1e-6)
    # and the textbook formula: biased variance, eps inside the sqrt
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    y = (x - mean) / torch.sqrt(var + 1e-5)
    if w is not None:
        y = y * w
    if b is not None:
        y = y + b
    torch.testing.assert_close(ln(x), y, rtol=1e-5, atol=1e-5)
    assert (ln.bias is not None) == (affine and bias)


@pytest.mark.parametrize("affine", [True, False])
def test_rmsnorm_matches_functional(affine):
    rms = RMSNorm(D, eps=1e-6, affine=affine)
    _randomize(rms)
    x = _x(4, 7, D)
    w = rms.weight if affine else None
    torch.testing.assert_close(rms(x), F.rms_norm(x, (D,), w, eps=1e-6), rtol=1e-6, atol=1e-6)
    y = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(rms(x), y * w if affine else y, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_statistics_fp32_under_bf16_autocast(kind):
    """Under CPU bf16 autocast the statistics are fp32: a large common offset with a small spread,
    which bf16 statistics would wreck, still normalizes like fp32 F.layer_norm/F.rms_norm."""
    mod = LayerNorm(D, eps=1e-5) if kind == "layernorm" else RMSNorm(D, eps=1e-6)
    _randomize(mod)
    x = _x(3, 5, D, scale=0.05, offset=40.0)  # fp32 activations entering the norm inside autocast
    if kind == "layernorm":
        ref = F.layer_norm(x, (D,), mod.weight, mod.bias, eps=1e-5)
        bad = F.layer_norm(x.bfloat16(), (D,), mod.weight.bfloat16(), mod.bias.bfloat16(), eps=1e-5).float()
    else:
        ref = F.rms_norm(x, (D,), mod.weight, eps=1e-6)
        xb = x.bfloat16()
        bad = (xb * torch.rsqrt((xb * xb).mean(-1, keepdim=True) + 1e-6) * mod.weight.bfloat16()).float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = mod(x)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
    assert (bad - ref).abs().max() > 1e-2  # the check above can tell bf16 statistics apart

    # bf16 input (what a bf16 residual stream gives): fp32 statistics of that input, output
    # rounded once; the result equals the fp32 reference on the same bf16 values to bf16 precision.
    xb = _x(3, 5, D).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        yb = mod(xb)
    if kind == "layernorm":
        refb = F.layer_norm(xb.float(), (D,), mod.weight, mod.bias, eps=1e-5)
    else:
        refb = F.rms_norm(xb.float(), (D,), mod.weight, eps=1e-6)
    torch.testing.assert_close(yb.float(), refb, rtol=1e-2, atol=1e-2)


# ----------------------------------------------------------------------------- DyT / Derf
def test_dyt_equation_and_scalar_alpha():
    for bias in (False, True):
        m = DyT(D, alpha_init=0.7, bias=bias)
        assert m.alpha.shape == (1,) and m.alpha.item() == pytest.approx(0.7)
        assert (m.bias is not None) == bias
        _randomize(m, seed=3)
        x = _x(2, 5, D)
        a = m.alpha.item()
        expected = m.weight * torch.tanh(a * x) + (m.bias if bias else 0.0)
        torch.testing.assert_close(m(x), expected, rtol=1e-6, atol=1e-6)


def test_derf_equation_and_scalar_alpha_shift():
    m = Derf(D, alpha_init=0.5, shift_init=0.0, bias=True)
    assert m.alpha.shape == (1,) and m.shift.shape == (1,)
    assert m.alpha.item() == pytest.approx(0.5) and m.shift.item() == 0.0
    _randomize(m, seed=4)
    x = _x(2, 5, D)
    a, s = m.alpha.item(), m.shift.item()
    assert s != 0.0
    z = a * x + s
    expected = m.weight * torch.tensor([math.erf(v) for v in z.flatten().tolist()]).view_as(z) + m.bias
    torch.testing.assert_close(m(x), expected, rtol=1e-5, atol=1e-5)


def test_norm_configs_defaults():
    """Config files: DyT follows the LLaMA recipe (no bias), Derf its GPT-2 patch (bias), LayerNorm nanoGPT.

    DyT/Derf leave a0 to the width rule; no norm file sets an init (the model preset does, docs/init.md).
    """
    dyt, derf, ln, rms = (compose([f"norm={n}"]).norm for n in ("dyt", "derf", "layernorm", "rmsnorm"))
    assert dyt.bias is False and derf.bias is True and ln.bias is True
    for n in (dyt, derf):
        assert (n.alpha_init_attn, n.alpha_init_ffn, n.alpha_init_final) == (None, None, None)
    assert derf.shift_init == 0.0
    assert ln.eps == 1e-5 and rms.eps == 1e-6
    assert dyt.embed_scale and derf.embed_scale and not ln.embed_scale and not rms.embed_scale
    assert not any(hasattr(n, "width_init") for n in (dyt, derf, ln, rms, compose(["norm=none"]).norm))
    assert isinstance(build_norm(dyt, D, "attn"), DyT) and isinstance(build_norm(derf, D, "ffn"), Derf)


@pytest.mark.parametrize(
    "d, dyt_alphas",
    [
        (64, (1.0, 1.0, 1.0)),  # narrower than the README table: the LLaMA code default
        (4095, (1.0, 1.0, 1.0)),
        (4096, (0.8, 0.2, 0.2)),  # LLaMA2 7B
        (5120, (0.6, 0.15, 0.15)),  # 13B
        (6656, (0.6, 0.15, 0.15)),
        (8192, (0.2, 0.05, 0.05)),  # 34B / 70B
    ],
)
def test_alpha_rule_by_width(d, dyt_alphas):
    assert tuple(alpha_rule("dyt", d).values()) == dyt_alphas
    assert tuple(alpha_rule("derf", d).values()) == (1.0, 1.0, 1.0)  # Derf: its patch's 1.0 at every width


@pytest.mark.parametrize("norm", ["dyt", "derf"])
def test_alpha_rule_reaches_every_site_and_overrides_win(norm):
    """q/k norms (head width 32) take the rule for the MODEL width; a set alpha_init_<site> wins."""
    cfg = compose(
        [
            "model=tiny",
            "model.d_model=4096",
            "model.n_head=128",
            "model.n_layer=1",
            f"norm={norm}",
            "arch.qk_norm=true",
            "norm.alpha_init_ffn=0.33",
        ]
    )
    model = build_model(cfg, 256)
    want_attn, want_final = (0.8, 0.2) if norm == "dyt" else (1.0, 1.0)
    block = model.blocks[0]
    for mod in (block.attn.norm_in, block.attn.core.q_norm, block.attn.core.k_norm):
        assert mod.alpha.item() == pytest.approx(want_attn)
    assert block.mlp.norm_in.alpha.item() == pytest.approx(0.33)
    assert model.ln_f.alpha.item() == pytest.approx(want_final)
    assert any(f"alpha0 attn/ffn/final {want_attn:g}/0.33/{want_final:g}" in n for n in check_combination(cfg))


@pytest.mark.parametrize("norm", ["layernorm", "dyt", "derf", "none"])
def test_init_is_the_model_presets_for_every_norm(norm):
    """model.init_std: auto is 0.02 * sqrt(768 / d) for every Linear and the embedding (output projections
    /sqrt(2L)), whatever the norm: a norm comparison starts from one init (the same draws, seed for seed)."""
    d, L = 256, 2
    overrides = ["model=tiny", f"model.d_model={d}", f"model.n_layer={L}"]
    torch.manual_seed(0)
    model = build_model(compose([*overrides, f"norm={norm}"]), 512)
    torch.manual_seed(0)
    ln = build_model(compose([*overrides, "norm=layernorm"]), 512)
    std = 0.02 * math.sqrt(768 / d)
    assert model.wte.weight.std().item() == pytest.approx(std, rel=0.05)
    block = model.blocks[0]
    assert block.attn.core.c_attn.weight.std().item() == pytest.approx(std, rel=0.05)
    assert block.mlp.core.c_proj.weight.std().item() == pytest.approx(std / math.sqrt(2 * L), rel=0.05)
    assert torch.equal(model.wte.weight, ln.wte.weight)
    assert torch.equal(block.attn.core.c_attn.weight, ln.blocks[0].attn.core.c_attn.weight)


@pytest.mark.parametrize("norm", ["layernorm", "derf"])
def test_hybridnorm_keeps_its_small_init_with_every_norm(norm):
    d = 256
    cfg = compose(["model=tiny", f"model.d_model={d}", "arch=hybridnorm", f"norm={norm}"])
    torch.manual_seed(0)
    model = build_model(cfg, 512)
    std = math.sqrt(2 / (5 * d))
    assert model.blocks[0].attn.core.c_attn.weight.std().item() == pytest.approx(std, rel=0.05)
    assert model.wte.weight.std().item() == pytest.approx(std, rel=0.05)


ARCH_SITES = {
    # arch -> {module path in block: site}; q/k/v norms take the attention site
    "pre_ln": {"attn.norm_in": "attn", "mlp.norm_in": "ffn"},
    "post_ln": {"attn.norm_post": "attn", "mlp.norm_post": "ffn"},
    "peri_ln": {"attn.norm_in": "attn", "attn.norm_out": "attn", "mlp.norm_in": "ffn", "mlp.norm_out": "ffn"},
    "hybridnorm": {"attn.core.q_norm": "attn", "attn.core.k_norm": "attn", "attn.core.v_norm": "attn"},
    "deepnorm": {"attn.norm_post": "attn", "mlp.norm_post": "ffn"},
}


@pytest.mark.parametrize("norm", ["dyt", "derf"])
@pytest.mark.parametrize("arch", sorted(ARCH_SITES))
def test_per_site_alpha_init(arch, norm):
    """Each DyT/Derf takes the alpha0 of the sublayer it belongs to; ln_f (and the embed norm) the final one."""
    cfg = compose(
        [
            "model=tiny",
            "model.d_model=32",
            f"arch={arch}",
            f"norm={norm}",
            "norm.alpha_init_attn=0.9",
            "norm.alpha_init_ffn=0.3",
            "norm.alpha_init_final=0.15",
            "arch.final_norm=true",
            "arch.embed_norm=true",
        ]
    )
    model = build_model(cfg, 256)
    want = {"attn": 0.9, "ffn": 0.3}
    cls = DyT if norm == "dyt" else Derf
    for block in model.blocks:
        for path, site in ARCH_SITES[arch].items():
            mod = block.get_submodule(path)
            assert isinstance(mod, cls), path
            assert mod.alpha.shape == (1,)
            assert mod.alpha.item() == pytest.approx(want[site]), path
    assert model.ln_f.alpha.item() == pytest.approx(0.15)
    assert model.emb_norm.alpha.item() == pytest.approx(0.15)
    alphas = [m.alpha for m in model.modules() if isinstance(m, cls)]
    assert alphas and all(a.numel() == 1 for a in alphas)


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm", "dyt", "derf", "none"])
def test_embed_scalar_only_for_dyt_derf(norm):
    d = 48
    cfg = compose(["model=tiny", f"model.d_model={d}", f"norm={norm}"])
    model = build_model(cfg, 256)
    if norm in ("dyt", "derf"):
        assert model.emb_scale is not None
        assert model.emb_scale.scale.shape == (1,)
        assert model.emb_scale.scale.item() == pytest.approx(math.sqrt(d))
        # applied to (token + position) embedding before the first block
        idx = torch.tensor([[1, 2, 3]])
        torch.testing.assert_close(model.embed(idx), model.wte(idx) * math.sqrt(d))
    else:
        assert model.emb_scale is None
        assert not any("emb_scale" in n for n, _ in model.named_parameters())


def test_embed_scalar_refused_outside_dyt_derf():
    cfg = compose(["model=tiny", "norm=rmsnorm", "norm.embed_scale=true"])
    with pytest.raises(ConfigError) as exc:
        check_combination(cfg)
    assert "\n" not in str(exc.value) and "embed_scale" in str(exc.value)


@pytest.mark.parametrize(
    "overrides, note",
    [
        (["arch=pre_ln", "arch.alpha=3.0"], "arch=pre_ln ignores arch.alpha/arch.beta"),
        (["arch=peri_ln", "arch.post_ratio=0.5"], "arch=peri_ln ignores arch.post_ratio=0.5"),
        (["arch=ngpt", "arch.qk_norm=true", "arch.final_norm=true"], "ignores arch.qk_norm=True, arch.final_norm=True"),
        (["arch=ngpt"], "arch=ngpt trains without warmup, as its reference: sched.warmup_steps=null"),
        (["arch=ngpt"], "arch=ngpt uses no weight decay anywhere (optim.weight_decay=0.1 ignored)"),
        (["arch=hybridnorm", "arch.qk_norm=true"], "arch=hybridnorm normalizes q, k and v by construction"),
        (["arch=peri_ln", "norm.affine=false"], "removes Peri-LN's Output-norm gains"),
    ],
)
def test_ignored_or_off_recipe_keys_are_noted(overrides, note):
    notes = validate(compose(["model=tiny", *overrides]))  # the one pass: the arch's recipe and combinations
    assert any(note in n for n in notes), notes


def test_ngpt_recipe_is_applied_before_validation_not_refused():
    """nGPT forces warmup 0 and no weight decay: a warmup it would ignore is not refused (it once was:
    ``sched.warmup_steps=100 trainer.max_steps=100``), the typed config holds the forced values."""
    cfg, notes = prepare(compose(["model=tiny", "arch=ngpt", "sched.warmup_steps=100", "trainer.max_steps=100"]))
    assert (cfg.sched.warmup_steps, cfg.optim.weight_decay) == (0, 0.0)
    assert any("sched.warmup_steps=100 ignored" in n for n in notes), notes
    with pytest.raises(ConfigError, match=r"^sched.warmup_steps=100 must be shorter than the run"):
        validate(compose(["model=tiny", "arch=pre_ln", "sched.warmup_steps=100", "trainer.max_steps=100"]))


def test_plain_configs_get_no_notes_and_mix_ln_keeps_its_final_norm():
    for arch in ("pre_ln", "post_ln", "peri_ln", "mix_ln", "hybridnorm", "hybridnorm_star", "deepnorm"):
        assert check_combination(compose(["model=tiny", f"arch={arch}"])) == [], arch
    ngpt = ["arch=ngpt", "norm=none", "sched.warmup_steps=0", "model.tie_embeddings=false"]
    assert check_combination(compose(["model=tiny", *ngpt])) == []
    with pytest.raises(ConfigError, match=r"^arch.final_norm=false: mix_ln always applies the final norm"):
        check_combination(compose(["model=tiny", "arch=mix_ln", "arch.final_norm=false"]))
