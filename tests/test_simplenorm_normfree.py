"""SimpleNorm (arch=simplenorm) and the norm-free archs (rezero, fixup, tfixup).

Equations against values worked out by hand in float64 on 2-wide blocks, the init statistics
against each paper's formula, the identities (ReZero and Fixup blocks are the identity at init), the
parameter kinds the weight-decay policy reads, diagnostics' per-layer lengths, the one-line refusals
and start-up notes, ``list arch``; the slow test trains each for 200 steps on model=tiny.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from types import SimpleNamespace

import pytest
import torch

from normbench import cli
from normbench.diag.diagnostics import Diagnostics
from normbench.errors import ConfigError
from normbench.model import build_model, check_combination
from normbench.model.kinds import param_kinds
from normbench.model.normfree import NormFreeBlock, fixup_branches, tfixup_factor
from normbench.model.simplegpt import SimpleAttention, SimpleMLP
from normbench.optim.optimizers import decayed_kinds
from normbench.train import trainer

from conftest import TINY, compose

F64 = torch.float64
NEW = ("simplenorm", "rezero", "fixup", "tfixup")


def rms_norm_cfg():
    cfg = compose(["norm=rmsnorm"]).norm
    cfg.eps = 1e-300  # negligible: the by-hand values are exact
    return cfg


def silu(z: float) -> float:
    return z / (1 + math.exp(-z))


def unit_rms(v: list[float]) -> list[float]:
    r = math.sqrt(sum(x * x for x in v) / len(v))
    return [x / r for x in v]


def set_(param, rows):
    with torch.no_grad():
        param.copy_(torch.tensor(rows, dtype=F64))


# ----------------------------------------------------------------------------------------- SimpleNorm
def test_simplenorm_swiglu_ffn_by_hand():
    mlp = SimpleMLP(2, 2, "swiglu", False, rms_norm_cfg()).double()
    set_(mlp.c_fc.weight, [[1, 0], [0, 1], [1, 1], [1, -1]])  # rows: up (identity), gate
    set_(mlp.c_proj.weight, [[1, 0], [0, 2]])
    y = mlp(torch.tensor([3.0, 4.0], dtype=F64))
    up = unit_rms([3, 4])  # [3, 4] / sqrt(12.5)
    gate = unit_rms([7, -1])  # [7, -1] / 5
    h = [silu(gate[0]) * up[0], silu(gate[1]) * up[1]]
    want = unit_rms([h[0], 2 * h[1]])
    assert torch.allclose(y, torch.tensor(want, dtype=F64), rtol=1e-12)


def test_simplenorm_attention_by_hand():
    """One head, d=2, two tokens, no RoPE: q, k, v each RMS-normalized over the width, then W_o, then N_o."""
    attn = SimpleAttention(2, 1, False, 0.0, rms_norm_cfg()).double()
    set_(attn.c_attn.weight, [[1, 0], [0, 1], [2, 0], [0, 1], [1, 1], [0, 1]])  # W_q = I, W_k = diag(2, 1), W_v
    set_(attn.c_proj.weight, [[1, 0], [0, 3]])
    x = torch.tensor([[[1.0, 0.0], [1.0, 1.0]]], dtype=F64)
    y = attn(x, None)
    q2 = unit_rms([1, 1])
    k1, k2 = unit_rms([2, 0]), unit_rms([2, 1])
    v1, v2 = unit_rms([1, 0]), unit_rms([2, 1])
    s1, s2 = ((q2[0] * k[0] + q2[1] * k[1]) / math.sqrt(2) for k in (k1, k2))
    p1 = math.exp(s1) / (math.exp(s1) + math.exp(s2))
    o2 = [p1 * v1[i] + (1 - p1) * v2[i] for i in range(2)]
    want = [unit_rms([v1[0], 3 * v1[1]]), unit_rms([o2[0], 3 * o2[1]])]  # token 1 sees only itself
    assert torch.allclose(y[0], torch.tensor(want, dtype=F64), rtol=1e-12)


def test_simplenorm_norms_are_whole_width_and_branches_have_unit_rms():
    cfg = compose(["model=tiny", "arch=simplenorm", "norm=rmsnorm", "norm.eps=1e-12"])
    torch.manual_seed(0)
    model = build_model(cfg, 64).double()
    d = cfg.model.d_model
    core = model.blocks[0].attn.core
    assert [n.weight.shape[0] for n in (core.q_norm, core.k_norm, core.v_norm, core.o_norm)] == [d] * 4
    block = model.blocks[1]
    assert block.attn.norm_in is None and block.mlp.norm_in is None  # no norm on a sublayer input
    for scale in (1e-3, 1.0, 1e3):  # whatever the stream's scale, each branch adds a unit-RMS vector
        x = torch.randn(2, 5, d, dtype=F64, generator=torch.Generator().manual_seed(1)) * scale
        h = block.attn(x, model.rope(x.device, F64))
        for branch in (h - x, block.mlp(h) - h):
            assert torch.allclose(branch.pow(2).mean(-1), torch.ones(2, 5, dtype=F64), rtol=1e-6)


def test_simplenorm_init_statistics():
    d, L, V = 128, 4, 4096
    cfg = compose(["model=tiny", f"model.d_model={d}", f"model.n_layer={L}", "arch=simplenorm"])
    torch.manual_seed(0)
    model = build_model(cfg, V)
    assert model.lm_head.weight is not model.wte.weight  # untied
    assert model.wte.weight.std().item() == pytest.approx(1.0, rel=0.02)  # N(0, 1)
    head = model.lm_head.weight
    assert head.abs().max().item() <= 3 * d**-0.5 + 1e-7  # cut at 3 std
    assert head.std().item() == pytest.approx(d**-0.5 * 0.9866, rel=0.02)  # std of a normal cut at +-3 sigma
    for layer, block in enumerate(model.blocks):
        deep = 0.02 / math.sqrt(2 * (layer + 1))
        attn, mlp = block.attn.core, block.mlp.core
        up, gate = mlp.c_fc.weight.chunk(2, dim=0)
        for w, std in (
            (attn.c_attn.weight, 0.02),
            (gate, 0.02),
            (attn.c_proj.weight, deep),
            (up, deep),
            (mlp.c_proj.weight, deep),
        ):
            assert w.std().item() == pytest.approx(std, rel=0.05), (layer, std)


def test_simplenorm_param_kinds_and_decay_policy():
    cfg = compose(["model=tiny", "arch=simplenorm", "optim.decay_norm_out=true"])
    kinds = param_kinds(build_model(cfg, 64))
    assert kinds["blocks.0.attn.core.o_norm.weight"] == "norm_out"
    assert kinds["blocks.1.mlp.core.down_norm.weight"] == "norm_out"
    for name in ("attn.core.q_norm", "attn.core.k_norm", "attn.core.v_norm", "mlp.core.fc_norm", "mlp.core.gate_norm"):
        assert kinds[f"blocks.0.{name}.weight"] == "norm_in"
    assert kinds["lm_head.weight"] == "head" and kinds["ln_f.weight"] == "norm_in"
    assert decayed_kinds(cfg.optim, "simplenorm") == {"matrix", "head", "norm_out"}


# ----------------------------------------------------------------------------------------- norm-free
def block(kind: str, mlp: str = "relu") -> NormFreeBlock:
    mcfg = SimpleNamespace(d_model=2, n_head=1, bias=False, dropout=0.0, mlp=mlp)
    b = NormFreeBlock(kind, mcfg, 2).double()
    set_(b.attn.core.c_attn.weight, [[1, 0], [0, 1], [1, 0], [0, 1], [1, 0], [0, 1]])  # W_v = I
    set_(b.attn.core.c_proj.weight, [[2, 0], [0, 1]])
    set_(b.mlp.core.c_fc.weight, [[1, -1], [1, 1]])
    set_(b.mlp.core.c_proj.weight, [[1, 0], [0, 0.2]])
    return b


X = torch.tensor([[[1.0, 2.0]]], dtype=F64)  # one token: attention returns W_o W_v x


def test_rezero_equation_by_hand():
    b = block("rezero")
    with torch.no_grad():
        b.resweight.fill_(0.5)
    # a = W_o x = [2, 2]; h = x + a/2 = [2, 3]; W1 h = [-1, 5] -> relu [0, 5]; W2 -> [0, 1]; x' = h + [0, 1]/2
    assert b(X, None).tolist() == [[[2.0, 3.5]]]


def test_tfixup_equation_is_the_plain_residual_by_hand():
    # h = x + [2, 2] = [3, 4]; W1 h = [-1, 7] -> [0, 7]; W2 -> [0, 1.4]
    assert torch.allclose(block("tfixup")(X, None), torch.tensor([[[3.0, 5.4]]], dtype=F64), rtol=1e-15)


def test_fixup_equation_by_hand():
    b = block("fixup")
    with torch.no_grad():
        b.attn.shift.fill_(0.5), b.attn.scale.fill_(2.0)
        b.mlp.shift.fill_(1.0), b.mlp.scale.fill_(0.5)
        b.mlp.core.shift_act.fill_(-1.0), b.mlp.core.shift_proj.fill_(2.0)
    # attn: x - 0.5 = [0.5, 1.5]; W_o -> [1, 1.5]; * 2 -> [2, 3]; h = [3, 5]
    # mlp: h - 1 = [2, 4]; W1 -> [-2, 6]; - (-1) -> [-1, 7]; relu [0, 7]; - 2 -> [-2, 5]; W2 -> [-2, 1]; * 0.5
    assert b(X, None).tolist() == [[[2.0, 5.5]]]


@pytest.mark.parametrize("arch", ["rezero", "fixup"])
def test_rezero_and_fixup_blocks_are_the_identity_at_init(arch):
    cfg = compose(["model=tiny", f"arch={arch}", "norm=none"])
    torch.manual_seed(0)
    model = build_model(cfg, 64)
    x = torch.randn(2, 7, cfg.model.d_model)
    rope = model.rope(x.device)
    assert all(torch.equal(b(x, rope), x) for b in model.blocks)
    idx = torch.randint(0, 64, (2, 7))
    logits, loss = model(idx, idx.roll(-1, 1))
    emb = model.wte(idx) * model.embed_mult  # sqrt(d) for Fixup, 1 for ReZero; tied head, no final norm
    assert torch.allclose(logits, emb @ model.wte.weight.T, rtol=1e-5, atol=1e-5)
    loss.backward()  # only the residual scalars (and embeddings / output projections for Fixup) get gradient
    if arch == "rezero":
        assert all(b.resweight.grad.abs().item() > 0 for b in model.blocks)
        assert all(b.attn.core.c_attn.weight.grad.abs().max() == 0 for b in model.blocks)
    else:
        assert all(b.mlp.core.c_proj.weight.grad.abs().max() > 0 for b in model.blocks)
        assert all(b.mlp.core.c_fc.weight.grad.abs().max() == 0 for b in model.blocks)


def _xavier_std(fan_in: int, fan_out: int, gain: float = 1.0) -> float:
    return gain * math.sqrt(2.0 / (fan_in + fan_out))


def test_fixup_init_statistics():
    d, L, V = 128, 4, 2048
    cfg = compose(
        [
            "model=tiny",
            f"model.d_model={d}",
            f"model.n_layer={L}",
            "arch=fixup",
            "norm=none",
            "model.tie_embeddings=false",
        ]
    )
    torch.manual_seed(0)
    model = build_model(cfg, V)
    m = fixup_branches(L)
    assert m == 8
    d_ff = model.blocks[0].mlp.core.c_proj.in_features
    assert model.wte.weight.std().item() == pytest.approx(d**-0.5, rel=0.02)
    assert model.embed_mult == pytest.approx(math.sqrt(d))
    assert model.lm_head.weight.abs().max() == 0  # the untied output embedding starts at 0
    for b in model.blocks:
        assert b.attn.core.c_attn.weight.std().item() == pytest.approx(_xavier_std(d, 3 * d) * m ** (-1 / 6), rel=0.03)
        for half in b.mlp.core.c_fc.weight.chunk(2, dim=0):
            assert half.std().item() == pytest.approx(_xavier_std(d, d_ff) * m**-0.5, rel=0.03)
        assert b.attn.core.c_proj.weight.abs().max() == 0 and b.mlp.core.c_proj.weight.abs().max() == 0
        assert [p.item() for p in (b.attn.shift, b.mlp.shift, b.mlp.core.shift_act, b.mlp.core.shift_proj)] == [0] * 4
        assert b.attn.scale.item() == 1 and b.mlp.scale.item() == 1


def test_tfixup_init_statistics():
    d, L, V = 128, 4, 2048
    cfg = compose(["model=tiny", f"model.d_model={d}", f"model.n_layer={L}", "arch=tfixup", "norm=none"])
    torch.manual_seed(0)
    model = build_model(cfg, V)
    c = tfixup_factor(L)
    assert c == pytest.approx(36**-0.25)
    d_ff = model.blocks[0].mlp.core.c_proj.in_features
    assert model.wte.weight.std().item() == pytest.approx(d**-0.5 * c, rel=0.02)  # tied: the head is it too
    for b in model.blocks:
        q, k, v = b.attn.core.c_attn.weight.chunk(3, dim=0)
        plain_qkv = _xavier_std(d, d, 2**-0.5)  # fairseq's q/k/v gain 1/sqrt(2)
        assert q.std().item() == pytest.approx(plain_qkv, rel=0.03)
        assert k.std().item() == pytest.approx(plain_qkv, rel=0.03)
        assert v.std().item() == pytest.approx(plain_qkv * math.sqrt(2) * c, rel=0.03)
        assert b.attn.core.c_proj.weight.std().item() == pytest.approx(_xavier_std(d, d) * c, rel=0.03)
        for half in b.mlp.core.c_fc.weight.chunk(2, dim=0):
            assert half.std().item() == pytest.approx(_xavier_std(d, d_ff) * c, rel=0.03)
        assert b.mlp.core.c_proj.weight.std().item() == pytest.approx(_xavier_std(d_ff, d) * c, rel=0.03)
    idx = torch.randint(0, V, (1, 5))
    assert torch.allclose(model.embed(idx), model.wte(idx) * math.sqrt(d))


def test_norm_free_param_kinds_and_no_norm_layers():
    for arch, scalars in (("rezero", {"blocks.0.resweight"}), ("tfixup", set())):
        kinds = param_kinds(build_model(compose(["model=tiny", f"arch={arch}"]), 64))
        assert {n for n, k in kinds.items() if k == "scalar"} >= scalars
        assert not any(k.startswith("norm") for k in kinds.values())
    kinds = param_kinds(build_model(compose(["model=tiny", "arch=fixup"]), 64))
    names = ("attn.shift", "attn.scale", "mlp.shift", "mlp.scale", "mlp.core.shift_act", "mlp.core.shift_proj")
    assert all(kinds[f"blocks.1.{n}"] == "scalar" for n in names) and kinds["ln_f.shift"] == "scalar"
    assert not any(k.startswith("norm") for k in kinds.values())


# ----------------------------------------------------------------------------------------- shared
@pytest.mark.parametrize("arch", NEW)
def test_diagnostics_per_layer_lengths(arch):
    cfg = compose([*TINY, "model.n_layer=3", "diag=full", f"arch={arch}"])
    torch.manual_seed(0)
    model = build_model(cfg, 64)
    diag = Diagnostics(cfg.diag, model, torch.randint(0, 64, (2, 17), generator=torch.Generator().manual_seed(1)))
    idx = torch.randint(0, 64, (2, 16))
    model(idx, idx)[1].backward()
    diag.grad_norms()
    diag.before_step()
    with torch.no_grad():
        for p in model.parameters():
            p -= 1e-3 * p.grad
    diag.after_step()
    rec = diag.collect()
    per_layer = (
        "grad_norm_layer",
        "grad_norm_attn",
        "grad_norm_mlp",
        "update_ratio_layer",
        "attn_entropy",
        "attn_logit_max",
        "angular_dist_layer",
    )
    assert all(len(rec[k]) == 3 for k in per_layer), {k: rec.get(k) for k in per_layer}
    assert all(len(rec[k]) == 4 for k in ("var_resid", "rms_resid", "kurtosis_resid"))
    assert all(math.isfinite(v) for k in per_layer for v in rec[k])


@pytest.mark.parametrize(
    "overrides,words",
    [
        (["arch=simplenorm", "norm=dyt"], ["norm=dyt", "allowed: rmsnorm, layernorm"]),
        (["arch=simplenorm", "model.fixnorm=true"], ["model.fixnorm", "allowed: false"]),
        (["arch=rezero", "arch.qk_norm=head"], ["arch.qk_norm=head", "allowed: none"]),
        (["arch=fixup", "arch.attn_gate=headwise"], ["arch.attn_gate=headwise", "allowed: none"]),
        (["arch=fixup", "arch.final_norm=true"], ["arch.final_norm=true", "allowed: false"]),
        (["arch=tfixup", "arch.embed_norm=true"], ["arch.embed_norm=true", "allowed: false"]),
        (["arch=tfixup", "model.fixnorm=true"], ["model.fixnorm", "allowed: false"]),
    ],
)
def test_refused_in_one_line(overrides, words):
    with pytest.raises(ConfigError) as exc:
        check_combination(compose(["model=tiny", *overrides]))
    assert "\n" not in str(exc.value) and all(w in str(exc.value) for w in words)


def test_start_up_notes():
    notes = check_combination(compose(["model=tiny", "arch=rezero", "norm=rmsnorm"]))
    assert notes == ["arch=rezero ignores norm=rmsnorm: it has no norm layer (use norm=none in sweeps)"]
    assert check_combination(compose(["model=tiny", "arch=fixup", "norm=none"])) == []
    notes = check_combination(compose(["model=tiny", "arch=tfixup", "norm=none", "model.init_std=0.1"]))
    assert notes == ["arch=tfixup ignores model.init_std=0.1: its paper's init sets every weight"]
    notes = check_combination(compose(["model=tiny", "arch=simplenorm", "norm=layernorm"]))
    assert len(notes) == 1 and "unties embeddings" in notes[0]
    notes = check_combination(compose(["model=tiny", "arch=simplenorm", "model.tie_embeddings=false"]))
    assert notes == []


def test_list_arch_shows_each_with_its_paper():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["list", "arch"]) == 0
    lines = {ln.split()[0]: ln for ln in out.getvalue().splitlines()[1:]}
    for arch, cite in (
        ("simplenorm", "2602.01212"),
        ("rezero", "2003.04887"),
        ("fixup", "1901.09321"),
        ("tfixup", "T-Fixup"),
    ):
        assert cite in lines[arch], lines[arch]


# ----------------------------------------------------------------------------------------- training
LEARN = ["model=tiny", "trainer.max_steps=200", "trainer.eval_every=50", "diag.every=50", "device=cpu", "seed=0"]
LEARN_RUNS = [
    ("simplenorm", "rmsnorm"),
    ("simplenorm", "layernorm"),
    ("rezero", "none"),
    ("fixup", "none"),
    ("tfixup", "none"),
]


@pytest.mark.slow
@pytest.mark.parametrize("arch,norm", LEARN_RUNS, ids=[f"{a}-{n}" for a, n in LEARN_RUNS])
def test_learns_on_tiny_in_200_steps(tmp_path, arch, norm):
    trainer.run(compose([*LEARN, f"arch={arch}", f"norm={norm}"]), tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["outcome"] == "learned", summary
    assert summary["best_val_loss"] < summary["baseline_loss"] - 0.3  # well clear of the unigram plateau


@pytest.mark.parametrize("arch", NEW)
def test_export_computes_it(arch):
    """Its own blocks travel to the exported class (loaded without normbench: tests/test_export_every.py)."""
    from normbench.export import build_hf_model

    cfg = compose(["model=tiny", f"arch={arch}"])
    torch.manual_seed(0)
    model = build_model(cfg, 64).eval()
    with torch.no_grad():
        for p in model.parameters():  # off the init (Fixup's zero projections, ReZero's zero scalars)
            p.add_(0.05 * torch.randn(p.shape))
    kind, hf = build_hf_model(model, cfg, 64)
    idx = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert kind == "custom" and torch.equal(model(idx)[0], hf(input_ids=idx).logits)


@pytest.mark.parametrize("cid", ["simplenorm_lr", "normfree_stable"])
def test_claims_load_and_every_planned_run_is_a_valid_config(cid, tmp_path):
    from normbench.claims.registry import load_claim
    from normbench.reproduce import runner
    from normbench.validation import validate

    claim = load_claim(cid)
    assert set(claim.scales) == {"cpu", "quick", "gpu"} and claim.tests
    for scale in ("cpu", "gpu"):
        _, _, jobs = runner.plan(claim, scale, None, [], tmp_path)
        settings = claim.sweep(scale).fixed
        distinct = {tuple(sorted((k, v) for k, v in j.items() if k != "seed")) for grid in jobs for j in grid}
        for job in sorted(distinct):  # the seed cannot make a config invalid
            cfg = compose([*settings, *(f"{k}={v}" for k, v in job)])
            validate(cfg)
            check_combination(cfg)  # no ConfigError: every run of the sweep can start
        archs = {j["arch"] for grid in jobs for j in grid}
        assert {t.group["arch"] for t in claim.tests} | {t.baseline["arch"] for t in claim.tests} <= archs


@pytest.mark.parametrize("arch", NEW)
def test_kv_cache_decoding_matches_the_full_forward(arch):
    """Sampling's cached path: feeding tokens one at a time gives the full forward's logits."""
    from normbench.model.attention import KVCache

    torch.manual_seed(0)
    model = build_model(compose(["model=tiny", f"arch={arch}"]), 64).eval()
    with torch.no_grad():
        for p in model.parameters():  # move off the identity init so every branch contributes
            p.add_(0.05 * torch.randn_like(p))
        idx = torch.randint(0, 64, (2, 9))
        full, _ = model(idx)
        cache = KVCache(len(model.blocks))
        first, _ = model(idx[:, :5], cache=cache)
        steps = [model(idx[:, t : t + 1], cache=cache)[0] for t in range(5, 9)]
    assert torch.allclose(torch.cat([first, *steps], dim=1), full, atol=1e-4)
