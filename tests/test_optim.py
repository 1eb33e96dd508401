"""Optimizers, the weight-decay policy and the LR schedules.

The update rules of Lion and Muon are written out here, independently of
src/normbench/optim/optimizers.py and muon.py, and compared with one optimizer step on a small tensor.
The training tests run in-process at a tiny size (seq 32, batch 4, 30 steps), single-threaded.
"""

from __future__ import annotations

import inspect
import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from normbench.model import build_model
from normbench.model.kinds import is_norm
from normbench.optim import optimizers as optim
from normbench.run.metrics import read_jsonl
from normbench.train import trainer
from normbench.validation import ARCHS, OPTIMS, validate

from conftest import compose

FAST = [
    "model=tiny",
    "model.seq_len=32",
    "trainer.batch_size=4",
    "diag=off",
    "trainer.log_every=1",
    "trainer.eval_every=1000",
    "trainer.eval_batches=1",
]


def _losses(run_dir: Path) -> list[float]:
    return [r["loss"] for r in read_jsonl(run_dir / "metrics.jsonl")]


def _model_and_optimizer(*overrides: str, vocab: int = 256):
    cfg = compose(["model=tiny", *overrides])
    torch.manual_seed(0)
    model = build_model(cfg, vocab)
    lines: list[str] = []
    opt = optim.build_optimizer(model, cfg, log=lines.append)
    return model, opt, lines


def _decayed_names(model, opt) -> set[str]:
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)] for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}


# --------------------------------------------------------------------------- update rules


def test_lion_step_matches_the_papers_update_rule():
    """Chen et al. 2023, Algorithm 2, with decoupled weight decay, over three steps, two tensors at once."""
    torch.manual_seed(0)
    shapes = [(5, 3), (4,)]
    p0 = [torch.randn(s) for s in shapes]
    grads = [[torch.randn(s) for s in shapes] for _ in range(3)]
    lr, b1, b2, wd = 0.01, 0.9, 0.99, 0.5
    params = [torch.nn.Parameter(x.clone()) for x in p0]
    opt = optim.Lion(params, lr=lr, betas=(b1, b2), weight_decay=wd)

    theta, m = [x.clone() for x in p0], [torch.zeros(s) for s in shapes]
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = g.clone()
        opt.step()
        for i, (p, g) in enumerate(zip(params, step_grads)):
            c = b1 * m[i] + (1 - b1) * g  # interpolate, take the sign
            theta[i] = theta[i] - lr * (torch.sign(c) + wd * theta[i])  # decoupled weight decay
            m[i] = b2 * m[i] + (1 - b2) * g  # then update the momentum with b2
            torch.testing.assert_close(p.detach(), theta[i], rtol=0, atol=1e-6)
            torch.testing.assert_close(opt.state[p]["exp_avg"], m[i], rtol=0, atol=1e-7)


def _newton_schulz5(g: torch.Tensor) -> torch.Tensor:
    """Keller Jordan's quintic Newton-Schulz iteration, 5 steps, in float64."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g.double()
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    x = x / x.norm()  # Frobenius norm >= spectral norm: singular values in (0, 1]
    for _ in range(5):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


def _muon_reference(p0, grads, *, lr, mu, wd, blocks, nesterov=True, adjust=True):
    """Muon on a matrix cut into ``blocks`` row blocks, each orthogonalized on its own."""
    theta, buf = p0.double().clone(), torch.zeros_like(p0, dtype=torch.float64)
    for g in grads:
        g = g.double()
        buf = mu * buf + (1 - mu) * g  # torch/Keller: momentum as an EMA (lerp)
        u = (1 - mu) * g + mu * buf if nesterov else buf
        parts = u.chunk(blocks, dim=0)
        o = torch.cat([_newton_schulz5(part) for part in parts], dim=0)
        rows, cols = parts[0].shape
        scale = math.sqrt(max(1.0, rows / cols)) if adjust else 1.0  # adjust_lr_fn="original"
        theta = theta * (1 - lr * wd) - lr * scale * o
    return theta


@pytest.mark.parametrize("shape,blocks", [((8, 4), 1), ((4, 8), 1), ((12, 4), 3)], ids=["tall", "wide", "qkv"])
def test_muon_step_matches_the_update_rule(shape, blocks):
    torch.manual_seed(1)
    p0 = torch.randn(shape)
    grads = [torch.randn(shape) for _ in range(3)]
    lr, mu, wd = 0.05, 0.95, 0.1
    p = torch.nn.Parameter(p0.clone())
    opt = optim.Muon([{"params": [p], "split": blocks, "weight_decay": wd}], lr=lr, momentum=mu, nesterov=True)
    for g in grads:
        p.grad = g.clone()
        opt.step()
    kw = dict(lr=lr, mu=mu, wd=wd, blocks=blocks)
    expected = _muon_reference(p0, grads, **kw)

    def rel_err(theta):  # relative to the size of the total update
        return ((p.detach().double() - theta).norm() / (theta - p0.double()).norm()).item()

    # torch runs Newton-Schulz in bf16: ~1% off the float64 rule
    assert rel_err(expected) < 0.04
    # ... while each plausible mistake is far outside that tolerance
    wrong = [_muon_reference(p0, grads, **{**kw, "nesterov": False})]
    wrong.append(_muon_reference(p0, grads, **{**kw, "blocks": 1}) if blocks > 1 else None)
    wrong.append(_muon_reference(p0, grads, **kw, adjust=False) if shape[0] // blocks > shape[1] else None)
    for theta in filter(lambda t: t is not None, wrong):
        assert rel_err(theta) > 0.15
    # momentum buffer: the EMA of the gradients, exactly
    ema = torch.zeros(shape)
    for g in grads:
        ema = mu * ema + (1 - mu) * g
    torch.testing.assert_close(opt.state[p]["momentum_buffer"], ema)


def test_muon_takes_the_hidden_matrices_and_splits_the_fused_ones():
    overrides = ["optim=muon", "arch=pre_ln", "model.mlp=swiglu", "optim.lr=0.03", "optim.adamw_lr=0.004"]
    model, opt, lines = _model_and_optimizer(*overrides)
    muon, adamw = opt.optimizers[1], opt.optimizers[0]
    assert isinstance(muon, optim.Muon) and isinstance(adamw, torch.optim.AdamW)
    names = {id(p): n for n, p in model.named_parameters()}
    split = {names[id(p)]: g["split"] for g in muon.param_groups for p in g["params"]}
    assert split == {
        "blocks.0.attn.core.c_attn.weight": 3,
        "blocks.1.attn.core.c_attn.weight": 3,
        "blocks.0.mlp.core.c_fc.weight": 2,
        "blocks.1.mlp.core.c_fc.weight": 2,
        "blocks.0.attn.core.c_proj.weight": 1,
        "blocks.1.attn.core.c_proj.weight": 1,
        "blocks.0.mlp.core.c_proj.weight": 1,
        "blocks.1.mlp.core.c_proj.weight": 1,
    }
    on_adamw = {names[id(p)] for g in adamw.param_groups for p in g["params"]}
    assert on_adamw == {n for n, _ in model.named_parameters()} - set(split)  # embeddings, norms: AdamW
    assert {g["lr"] for g in muon.param_groups} == {0.03} and {g["lr"] for g in adamw.param_groups} == {0.004}
    assert any("[muon]" in ln and "orthogonalized as 3 row blocks" in ln for ln in lines)


@pytest.mark.parametrize("nesterov", [True, False])
def test_muon_is_torchs_muon_bit_for_bit_and_a_split_is_separate_matrices(nesterov):
    """optim.Muon repeats torch.optim.Muon's arithmetic op for op (it fails if a torch changes its own; then
    the muon.py docstring's claim needs its torch version): split=1 gives torch's parameters and momentum
    buffers exactly, and split=3 gives what torch's Muon gives three separate matrices (the q, k, v blocks)."""
    torch.manual_seed(2)
    p0, grads = torch.randn(12, 4), [torch.randn(12, 4) for _ in range(3)]
    kw = dict(lr=0.05, momentum=0.9, nesterov=nesterov, weight_decay=0.1)
    ours = [torch.nn.Parameter(p0.clone()), torch.nn.Parameter(p0.clone())]
    opt = optim.Muon([{"params": ours[:1], "split": 1}, {"params": ours[1:], "split": 3}], **kw)
    whole = torch.nn.Parameter(p0.clone())
    blocks = [torch.nn.Parameter(b.clone()) for b in p0.chunk(3)]
    ref = torch.optim.Muon([whole, *blocks], **kw)
    for g in grads:
        for p in ours:
            p.grad = g.clone()
        whole.grad = g.clone()
        for b, gb in zip(blocks, g.chunk(3)):
            b.grad = gb.clone()
        opt.step()
        ref.step()
    assert torch.equal(ours[0], whole) and torch.equal(ours[1], torch.cat(blocks))
    assert torch.equal(opt.state[ours[0]]["momentum_buffer"], ref.state[whole]["momentum_buffer"])
    assert torch.equal(
        opt.state[ours[1]]["momentum_buffer"], torch.cat([ref.state[b]["momentum_buffer"] for b in blocks])
    )
    # the same state dict layout as torch's: a checkpoint of either loads into the other
    sd, ref_sd = opt.state_dict(), torch.optim.Muon([whole], **kw).state_dict()
    assert set(sd["param_groups"][0]) == set(ref_sd["param_groups"][0]) | {"split"}


def _private_torch_overrides(cls: type) -> list[str]:
    """``_name`` members (not dunders) that ``cls`` or a non-torch base defines or calls on ``self``/``super()``
    while a torch base class has them: a private torch.optim hook overridden or used."""
    torch_bases = [k for k in cls.__mro__ if k.__module__.startswith("torch")]
    found = []
    for klass in cls.__mro__:
        if klass.__module__.startswith("torch") or klass is object:
            continue
        defined = {a for a in vars(klass) if a.startswith("_") and not a.endswith("__")}
        called = set(re.findall(r"(?:self|super\(\))\.(_[A-Za-z]\w*)", inspect.getsource(klass)))
        found += [
            f"{klass.__qualname__}.{a}" for a in sorted(defined | called) if any(a in vars(t) for t in torch_bases)
        ]
    return found


def test_no_private_torch_optimizer_member_is_overridden_or_called():
    """normbench's optimizers use torch.optim's public surface only: every Optimizer subclass normbench
    defines and every optimizer the registry builds. A subclass overriding torch.optim.Muon._init_group is caught."""

    class Hooked(torch.optim.Muon):
        def _init_group(self, *args):
            return super()._init_group(*args)

    assert _private_torch_overrides(Hooked) == [f"{Hooked.__qualname__}._init_group"]
    classes, todo = set(), [torch.optim.Optimizer]
    while todo:
        todo += (subs := todo.pop().__subclasses__())
        classes |= {c for c in subs if c.__module__.startswith("normbench")}
    for name in OPTIMS:
        classes |= {type(o) for o in _model_and_optimizer(f"optim={name}")[1].optimizers}
    assert {optim.Lion, optim.Muon} <= classes
    assert [f for c in sorted(classes, key=str) for f in _private_torch_overrides(c)] == []


# --------------------------------------------------------------------------- parameter groups

PERI_LN_DECAYED = {
    "blocks.0.attn.core.c_attn.weight",
    "blocks.0.attn.core.c_proj.weight",
    "blocks.0.mlp.core.c_fc.weight",
    "blocks.0.mlp.core.c_proj.weight",
    "blocks.1.attn.core.c_attn.weight",
    "blocks.1.attn.core.c_proj.weight",
    "blocks.1.mlp.core.c_fc.weight",
    "blocks.1.mlp.core.c_proj.weight",
}
PERI_LN_NOT_DECAYED = {
    "wte.weight",  # tied with lm_head: one embedding tensor
    "blocks.0.attn.norm_in.weight",
    "blocks.0.attn.norm_out.weight",
    "blocks.0.mlp.norm_in.weight",
    "blocks.0.mlp.norm_out.weight",
    "blocks.1.attn.norm_in.weight",
    "blocks.1.attn.norm_out.weight",
    "blocks.1.mlp.norm_in.weight",
    "blocks.1.mlp.norm_out.weight",
    "ln_f.weight",
}


def test_peri_ln_default_policy_decays_exactly_the_hidden_matrices():
    model, opt, lines = _model_and_optimizer("arch=peri_ln", "optim=adamw")
    assert {n for n, _ in model.named_parameters()} == PERI_LN_DECAYED | PERI_LN_NOT_DECAYED
    assert _decayed_names(model, opt) == PERI_LN_DECAYED
    assert {g["weight_decay"] for g in opt.param_groups} == {0.0, 0.1}
    # logged at start: one line per group with its count and example names
    assert len(lines) == len(opt.param_groups) == 2
    decayed_line = next(ln for ln in lines if "wd=0.1" in ln)
    assert "8 tensors" in decayed_line and "blocks.0.attn.core.c_attn.weight" in decayed_line
    other = next(ln for ln in lines if "wd=0:" in ln)
    assert "10 tensors" in other and "embed/norm_in/norm_out" in other


# A model with every kind: LayerNorm with bias, Linear biases, untied head, learned positions,
# embedding norm, QK-norm. DyT adds the scalar kinds (alpha, the embedding scale).
RICH = ["arch=peri_ln", "arch.embed_norm=true", "arch.qk_norm=true", "model.bias=true"]
RICH += ["model.tie_embeddings=false", "model.pos=learned", "norm=layernorm"]


@pytest.mark.parametrize(
    "switch,expected",
    [
        (
            "decay_norm_in",
            {
                "blocks.0.attn.norm_in.weight",
                "blocks.1.mlp.norm_in.weight",
                "ln_f.weight",
                "emb_norm.weight",
                "blocks.0.attn.core.q_norm.weight",
                "blocks.1.attn.core.k_norm.weight",
            },
        ),
        ("decay_norm_out", {"blocks.0.attn.norm_out.weight", "blocks.1.mlp.norm_out.weight"}),
        (
            "decay_bias",
            {
                "blocks.0.attn.core.c_attn.bias",
                "blocks.0.mlp.core.c_proj.bias",
                "blocks.0.attn.norm_in.bias",
                "ln_f.bias",
            },
        ),
        ("decay_embed", {"wte.weight", "wpe.weight"}),
    ],
)
def test_each_decay_switch_adds_exactly_its_kind(switch, expected):
    model, opt, _ = _model_and_optimizer(*RICH)
    kinds = optim.param_kinds(model)
    base = _decayed_names(model, opt)
    assert base == {n for n, k in kinds.items() if k in ("matrix", "head")}
    assert "lm_head.weight" in base  # an untied head is decayed
    model, opt, _ = _model_and_optimizer(*RICH, f"optim.{switch}=true")
    added = _decayed_names(model, opt) - base
    kind = {"decay_norm_in": "norm_in", "decay_norm_out": "norm_out", "decay_bias": "bias", "decay_embed": "embed"}
    assert added == {n for n, k in kinds.items() if k == kind[switch]}
    assert expected <= added


def test_scalar_switch_decays_dyt_alpha_and_embedding_scale():
    overrides = ["arch=pre_ln", "norm=dyt"]
    model, opt, _ = _model_and_optimizer(*overrides)
    assert not any("alpha" in n or "emb_scale" in n for n in _decayed_names(model, opt))
    model, opt, _ = _model_and_optimizer(*overrides, "optim.decay_scalars=true")
    added = {n for n in _decayed_names(model, opt) if optim.param_kinds(model)[n] == "scalar"}
    assert added == {
        "emb_scale.scale",
        "blocks.0.attn.norm_in.alpha",
        "blocks.0.mlp.norm_in.alpha",
        "blocks.1.attn.norm_in.alpha",
        "blocks.1.mlp.norm_in.alpha",
        "ln_f.alpha",
    }


@pytest.mark.parametrize(
    "arch,expected",
    [
        ("post_ln", {"blocks.0.attn.norm_post.weight": "norm_out", "blocks.1.mlp.norm_post.weight": "norm_out"}),
        ("deepnorm", {"blocks.0.attn.norm_post.weight": "norm_out"}),
        (
            "mix_ln",
            {
                "blocks.0.attn.norm_post.weight": "norm_out",
                "blocks.1.attn.norm_in.weight": "norm_in",
                "ln_f.weight": "norm_in",
            },
        ),
        # HybridNorm's FFN norm normalizes x + attn and carries the residual: output side
        (
            "hybridnorm",
            {
                "blocks.0.mlp.norm_in.weight": "norm_out",
                "blocks.0.attn.core.q_norm.weight": "norm_in",
                "blocks.0.attn.core.v_norm.weight": "norm_in",
                "ln_f.weight": "norm_in",
            },
        ),
        (
            "hybridnorm_star",
            {
                "blocks.0.attn.norm_in.weight": "norm_in",
                "blocks.0.mlp.norm_in.weight": "norm_in",
                "blocks.1.mlp.norm_in.weight": "norm_out",
            },
        ),
        (
            "ngpt",
            {
                "blocks.0.attn_alpha.param": "scalar",
                "blocks.0.sqk.param": "scalar",
                "sz.param": "scalar",
                "blocks.0.c_attn.weight": "matrix",
                "lm_head.weight": "head",
                "wte.weight": "embed",
            },
        ),
    ],
)
def test_param_kinds_per_arch(arch, expected):
    extra = ["model.n_layer=4", "arch.post_ratio=0.25"] if arch == "mix_ln" else []
    model = build_model(compose(["model=tiny", f"arch={arch}", *extra]), 256)
    kinds = optim.param_kinds(model)
    assert set(kinds) == {n for n, _ in model.named_parameters()}
    assert {n: kinds[n] for n in expected} == expected


def test_ngpt_never_decays_and_says_so():
    model, opt, lines = _model_and_optimizer(
        "arch=ngpt", "optim.weight_decay=0.1", "optim.decay_norm_in=true", "optim.decay_scalars=true"
    )
    assert {g["weight_decay"] for g in opt.param_groups} == {0.0}  # also where the recipe was not applied
    from normbench.validation import validate

    notes = validate(compose(["model=tiny", "arch=ngpt", "optim.weight_decay=0.1"]))  # the one pass says so
    assert "arch=ngpt uses no weight decay anywhere (optim.weight_decay=0.1 ignored)" in notes
    notes = validate(compose(["model=tiny", "arch=ngpt", "optim.weight_decay=0", "sched.warmup_steps=0"]))
    assert not any("weight decay" in n or "warmup" in n for n in notes)  # nothing ignored, nothing to say


def test_ngpt_trains_without_warmup_and_pre_ln_keeps_it(tmp_path):
    """sched.warmup_steps=null is 10% of the run, except under nGPT, whose recipe has none."""
    base = ["model=tiny", "trainer.max_steps=20", "trainer.log_every=1", "diag=off", "sched=constant", "optim.lr=1e-3"]
    for arch, first_lr in (("ngpt", 1e-3), ("pre_ln", 1e-3 / 2)):  # warmup 2 steps: (0 + 1) / 2
        run_dir = tmp_path / arch
        trainer.run(compose([*base, f"arch={arch}"]), run_dir)
        lrs = [r["lr"] for r in read_jsonl(run_dir / "metrics.jsonl")]
        assert lrs[0] == pytest.approx(first_lr) and lrs[-1] == pytest.approx(1e-3), (arch, lrs[:3])


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm", "dyt", "derf"])
def test_affine_false_removes_every_gain_and_keeps_scalar_alpha(norm, tmp_path):
    overrides = [f"norm={norm}", "norm.affine=false", "norm.bias=true", "arch=peri_ln", "arch.qk_norm=true"]
    model = build_model(compose(["model=tiny", *overrides]), 256)
    kinds = optim.param_kinds(model)
    norm_modules = [m for m in model.modules() if is_norm(m)]
    assert len(norm_modules) == 2 * 4 + 2 * 2 + 1  # 4 per block, q/k norms per block, ln_f
    assert not {k for k in kinds.values()} & {"norm_in", "norm_out"}
    assert all(m.weight is None and getattr(m, "bias", None) is None for m in norm_modules)
    if norm in ("dyt", "derf"):
        assert all(m.alpha.shape == (1,) for m in norm_modules)
        assert all((m.shift is not None) == (norm == "derf") for m in norm_modules)
    else:
        assert not any(True for m in norm_modules for _ in m.parameters())
    summary = trainer.run(compose([*FAST, *overrides, "trainer.max_steps=30"]), tmp_path)
    losses = _losses(tmp_path)
    assert summary["status"] == "completed"
    assert sum(losses[-5:]) / 5 < losses[0] - 0.15, losses


# --------------------------------------------------------------------------- schedules


def _sched(name, warmup, floor=0.1, decay_fraction=0.2):
    return SimpleNamespace(name=name, warmup_steps=warmup, min_lr_ratio=floor, decay_fraction=decay_fraction)


@pytest.mark.parametrize(
    "sched,max_steps,step,factor",
    [
        # linear warmup (step + 1) / warmup, the same for every schedule
        (_sched("cosine", 10), 100, 0, 0.1),
        (_sched("cosine", 10), 100, 4, 0.5),
        (_sched("constant", 10), 100, 9, 1.0),
        (_sched("wsd", 10), 100, 0, 0.1),
        # cosine: 0.1 + 0.9 * 0.5 * (1 + cos(pi * (step - 10) / 90))
        (_sched("cosine", 10), 100, 10, 1.0),
        (_sched("cosine", 10), 100, 55, 0.55),
        (_sched("cosine", 10), 100, 40, 0.1 + 0.45 * 1.5),  # cos(pi/3) = 0.5
        (_sched("cosine", 10), 100, 100, 0.1),
        (_sched("cosine", 0), 100, 0, 1.0),  # no warmup: full LR at once
        (_sched("cosine", 0), 100, 50, 0.55),
        # warmup null: 10% of the run
        (_sched("cosine", None), 50, 0, 0.2),
        (_sched("cosine", None), 50, 4, 1.0),
        (_sched("constant", None), 50, 1, 0.4),
        # constant
        (_sched("constant", 0), 100, 0, 1.0),
        (_sched("constant", 10), 100, 99, 1.0),
        # wsd: stable until the last 20 steps, then linear to the floor (0.0 here) at step 100
        (_sched("wsd", 10, floor=0.0), 100, 10, 1.0),
        (_sched("wsd", 10, floor=0.0), 100, 79, 1.0),
        (_sched("wsd", 10, floor=0.0), 100, 80, 1.0),
        (_sched("wsd", 10, floor=0.0), 100, 90, 0.5),
        (_sched("wsd", 10, floor=0.0), 100, 99, 0.05),
        (_sched("wsd", 10, floor=0.1), 100, 90, 0.55),
        (_sched("wsd", 0, floor=0.0), 100, 0, 1.0),
        (_sched("wsd", None, floor=0.0), 200, 19, 1.0),  # warmup 20 of 200
        (_sched("wsd", None, floor=0.0), 200, 160, 1.0),  # decay: the last 0.2 * 200 = 40 steps
        (_sched("wsd", None, floor=0.0), 200, 180, 0.5),
        (_sched("wsd", None, floor=0.0), 200, 190, 0.25),
        # decay longer than the post-warmup part starts right after the warmup, without a jump
        (_sched("wsd", 10, floor=0.0, decay_fraction=1.0), 100, 10, 1.0),
        (_sched("wsd", 10, floor=0.0, decay_fraction=1.0), 100, 55, 0.5),
    ],
)
def test_lr_factor_matches_hand_computed_values(sched, max_steps, step, factor):
    assert optim.lr_factor(step, max_steps, sched) == pytest.approx(factor, abs=1e-12)


def test_training_follows_wsd_without_warmup(tmp_path):
    args = [*FAST, "optim=adamw", "optim.lr=0.004", "sched=wsd", "sched.warmup_steps=0", "sched.decay_fraction=0.5"]
    trainer.run(compose([*args, "trainer.max_steps=10"]), tmp_path)
    lrs = [r["lr"] for r in read_jsonl(tmp_path / "metrics.jsonl")]
    assert lrs == pytest.approx([0.004 * f for f in (1, 1, 1, 1, 1, 1, 0.8, 0.6, 0.4, 0.2)])


def test_set_lr_scales_every_group_from_its_own_base_lr():
    _, opt, _ = _model_and_optimizer("optim=muon", "optim.lr=0.02", "optim.adamw_lr=0.003")
    first = optim.set_lr(opt, 0.5)
    lrs = sorted({g["lr"] for g in opt.param_groups})
    assert lrs == pytest.approx([0.0015, 0.01]) and first == pytest.approx(0.0015)


def test_config_hyperparameters_win_over_a_loaded_checkpoint():
    """A resume with an allowed ``optim.lr`` change uses the new LR; the state still comes back."""
    model, opt, _ = _model_and_optimizer("optim=lion", "optim.lr=1e-4")
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    saved = opt.state_dict()
    model2 = build_model(compose(["model=tiny", "optim=lion"]), 256)
    model2.load_state_dict(model.state_dict())
    opt2 = optim.build_optimizer(model2, compose(["model=tiny", "optim=lion", "optim.lr=5e-5"]), log=lambda s: None)
    opt2.load_state_dict(saved)
    assert {g["base_lr"] for g in opt2.param_groups} == {5e-5}
    p2 = next(model2.parameters())
    torch.testing.assert_close(opt2.optimizers[0].state[p2]["exp_avg"], torch.full_like(p2, 0.01))
    _, muon, _ = _model_and_optimizer("optim=muon")
    with pytest.raises(ValueError, match="2 optimizer"):  # a checkpoint of AdamW+Muon does not fit Lion
        opt2.load_state_dict(muon.state_dict())


# --------------------------------------------------------------------------- training


# Every optimizer on Pre-LN, nGPT (unit-norm rows) and ReZero (residual scalars from 0) in the default suite; the
# other archs in the slow one (CI runs both): each arch trains under AdamW in tests/test_archs_train.py too
CORE_ARCHS = ("pre_ln", "ngpt", "rezero")
OPTIM_ARCHS = [
    pytest.param(name, arch, marks=() if arch in CORE_ARCHS else pytest.mark.slow, id=f"{name}-{arch}")
    for name in OPTIMS
    for arch in ARCHS
]


@pytest.mark.parametrize("name,arch", OPTIM_ARCHS)
def test_every_optimizer_trains_every_arch(name, arch, tmp_path):
    # nGPT's unit-norm rows have ~6x larger elements than N(0, 0.02) at d=64, and Lion moves each
    # element by exactly lr: nGPT needs Lion's LR at the top of its range (conf/optim/lion.yaml)
    # ReZero likewise: its residual scalars start at 0 and Lion moves them by lr per step (1e-2 after 30 steps
    # at Lion's default 3e-4, too little for the branches to matter yet)
    lr = ["optim.lr=3e-3"] if (name, arch) in (("lion", "ngpt"), ("lion", "rezero")) else []
    summary = trainer.run(compose([*FAST, f"optim={name}", f"arch={arch}", "trainer.max_steps=30", *lr]), tmp_path)
    losses = _losses(tmp_path)
    assert summary["status"] == "completed" and len(losses) == 30
    assert all(math.isfinite(x) for x in losses)
    assert sum(losses[-5:]) / 5 < losses[0] - 0.15, losses  # the smallest fall measured: 0.27 (adamw, ngpt)


@pytest.mark.parametrize("name", OPTIMS)
def test_resume_restores_the_optimizer_state_exactly(name, tmp_path, monkeypatch):
    args = [*FAST, f"optim={name}", "arch=peri_ln", "trainer.max_steps=8", "trainer.ckpt_every=100"]
    trainer.run(compose(args), tmp_path / "full")

    original = trainer.Trainer.optimizer_step

    def stop_after_4(self, grad_norm):
        stepped = original(self, grad_norm)
        if self.step == 3:  # the 4th step: stop as a SIGTERM would (checkpoint after step 4)
            self.stop_signal = 15
        return stepped

    monkeypatch.setattr(trainer.Trainer, "optimizer_step", stop_after_4)
    with pytest.raises(trainer.Interrupted):
        trainer.run(compose(args), tmp_path / "cut")
    assert len(_losses(tmp_path / "cut")) == 4
    monkeypatch.setattr(trainer.Trainer, "optimizer_step", original)
    trainer.run(compose([*args, "trainer.resume=true"]), tmp_path / "cut")
    assert "at step 4" in (tmp_path / "cut" / "train.log").read_text().split("resumed from", 1)[1].splitlines()[0]

    full, cut = _losses(tmp_path / "full"), _losses(tmp_path / "cut")
    assert len(full) == len(cut) == 8
    assert cut == full  # bit-identical on CPU
    a = torch.load(tmp_path / "full" / "checkpoints" / "last.pt", weights_only=True)
    b = torch.load(tmp_path / "cut" / "checkpoints" / "last.pt", weights_only=True)
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k
    sa, sb = a["optimizer"], b["optimizer"]  # keyed by parameter name
    assert sa["state"].keys() == sb["state"].keys() and sa["state"]
    for pname, entries in sa["state"].items():
        for k, v in entries.items():
            assert torch.equal(torch.as_tensor(v), torch.as_tensor(sb["state"][pname][k])), (name, pname, k)


def test_optim_experiment_crosses_every_placement_with_every_optimizer():
    import yaml

    from normbench.config.files import config_dir
    from normbench.model import check_combination

    def params(name):
        return yaml.safe_load((config_dir() / "experiment" / f"{name}.yaml").read_text())["hydra"]["sweeper"]["params"]

    archs, optims = params("optim")["arch"].split(","), params("optim")["optim"].split(",")
    # the placements of experiment=placement and nGPT (the further ones: experiment=placement_more)
    assert set(optims) == set(OPTIMS) and set(archs) == set(params("placement")["arch"].split(",")) | {"ngpt"}
    assert set(archs) <= set(ARCHS)
    # groups compose independently: every arch once and every optimizer once cover the grid
    pairs = {(arch, optims[i % len(optims)]) for i, arch in enumerate(archs)}
    pairs |= {(archs[i % len(archs)], name) for i, name in enumerate(optims)}
    for arch, name in sorted(pairs):
        cfg = compose(["experiment=optim", f"arch={arch}", f"optim={name}"])
        assert (cfg.model.name, cfg.trainer.max_steps, cfg.arch.name, cfg.optim.name) == ("tiny", 200, arch, name)
        validate(cfg)
        check_combination(cfg)


def test_an_optimizer_registered_elsewhere_is_valid_listed_and_built(monkeypatch, capsys):
    """optim.py's registry is what validation, its error message and `list` read: a builder registered in a
    test (no other file touched) is accepted and built with the weight-decay groups; a name outside
    the registry is refused naming the registered ones."""
    from normbench.errors import ConfigError

    monkeypatch.setitem(optim.OPTIMIZERS, "test_plain_sgd", None)  # removed again after the test
    optim.register_optimizer("test_plain_sgd")(lambda groups, ocfg, dev: [torch.optim.SGD(groups("test_plain_sgd"))])
    cfg = compose(["model=tiny", "optim.name=test_plain_sgd", "optim.lr=0.5"])
    validate(cfg)
    (opt,) = optim.build_optimizer(build_model(cfg, 256), cfg, log=lambda *_: None).optimizers
    assert isinstance(opt, torch.optim.SGD) and {g["weight_decay"] for g in opt.param_groups} == {0.0, 0.1}
    from normbench import cli

    assert cli.main(["list", "optim"]) == 0  # listed too, with how to choose it
    assert "test_plain_sgd   registered in code, no conf/optim/test_plain_sgd.yaml" in capsys.readouterr().out
    refused = r"^optim.name='nope' is not allowed; choose one of: adamw, sgd, .*test_plain_sgd"
    with pytest.raises(ConfigError, match=refused):
        validate(compose(["model=tiny", "optim.name=nope"]))
