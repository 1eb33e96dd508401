"""muP and CompleteP (model/mup.py): SP unchanged, per-group multipliers, init, refusals, export, coordinate check."""

from __future__ import annotations

import math

import pytest
import torch

from normbench.errors import ConfigError
from normbench.model import build_model
from normbench.model.kinds import param_kinds
from normbench.optim.optimizers import build_optimizer
from normbench.validation import prepare

from conftest import compose

VOCAB = 256
D256 = ["model.param=mup", "model.d_model=256", "model.n_head=16"]


def built(*overrides: str, seed: int = 0):
    cfg, _ = prepare(compose(["model=tiny", "trainer.batch_size=4", *overrides]))
    torch.manual_seed(seed)
    model = build_model(cfg, VOCAB)
    return cfg, model, build_optimizer(model, cfg, log=lambda *_: None)


def losses(*overrides: str, steps: int = 4) -> list[float]:
    cfg, model, opt = built(*overrides)
    x = torch.randint(0, VOCAB, (4, 33), generator=torch.Generator().manual_seed(1))
    out = []
    for _ in range(steps):
        _, loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad()
        out.append(loss.item())
    return out


def group_of(opt, model, name: str) -> dict:
    p = dict(model.named_parameters())[name]
    return next(g for g in opt.param_groups if any(q is p for q in g["params"]))


@pytest.mark.parametrize("tied", ["true", "false"])
@pytest.mark.parametrize("arch", ["pre_ln", "post_ln"])
def test_sp_is_todays_model_and_mup_at_the_base_width_is_sp_bit_for_bit(arch, tied):
    """Untied too: muP's readout std is drawn once, in SP's place, so the same RNG draws follow (a second head
    draw shifted the embedding's: start loss 5.600 under SP, 5.649 under muP, before the fix)."""
    plain = losses(f"arch={arch}", f"model.tie_embeddings={tied}")
    assert losses(f"arch={arch}", f"model.tie_embeddings={tied}", "model.param=sp") == plain
    assert losses(f"arch={arch}", f"model.tie_embeddings={tied}", "model.param=mup") == plain  # m = 1: all 1
    assert plain[-1] < plain[0]


def test_the_hidden_matrices_get_lr_over_m_and_decay_times_m_from_their_shapes():
    cfg, model, opt = built(*D256, "optim.lr=1e-2", "optim.weight_decay=0.1")
    qkv = group_of(opt, model, "blocks.0.attn.core.c_attn.weight")
    assert qkv["lr"] == pytest.approx(1e-2 / 4) and qkv["weight_decay"] == pytest.approx(0.4)
    # SwiGLU's d_ff is 192 at d 64 and 704 at d 256: c_proj's fan_in grows 704/192, not 4
    down = group_of(opt, model, "blocks.0.mlp.core.c_proj.weight")
    assert down["lr"] == pytest.approx(1e-2 * 192 / 704) and down["weight_decay"] == pytest.approx(0.1 * 704 / 192)
    for name in ("wte.weight", "blocks.0.attn.norm_in.weight", "ln_f.weight"):  # embedding and vectors: eta
        g = group_of(opt, model, name)
        assert g["lr"] == pytest.approx(1e-2) and g["weight_decay"] == 0.0
    assert all(g["eps"] == 1e-8 for g in opt.param_groups)
    assert all(g["base_lr"] == g["lr"] for g in opt.param_groups)  # the schedule scales each group's own lr


@pytest.mark.parametrize(("decay", "expected"), [("width", 0.4), ("coupled", 0.1), ("none", 0.0)])
def test_mup_decay_choices(decay, expected):
    _, model, opt = built(*D256, f"optim.mup_decay={decay}")
    assert group_of(opt, model, "blocks.1.attn.core.c_proj.weight")["weight_decay"] == pytest.approx(expected)


def test_mup_eps_width_divides_every_adam_eps_by_m():
    _, _, opt = built(*D256, "optim.mup_eps=width", "optim.eps=1e-8")
    assert [g["eps"] for g in opt.param_groups] == pytest.approx([0.25e-8] * len(opt.param_groups))


def test_muon_keeps_its_matrix_lr_and_lion_takes_adams_rule():
    _, model, opt = built(*D256, "optim=muon", "optim.lr=0.05")
    assert group_of(opt, model, "blocks.0.attn.core.c_attn.weight")["lr"] == pytest.approx(0.05)
    _, model, opt = built(*D256, "optim=lion", "optim.lr=1e-4")
    assert group_of(opt, model, "blocks.0.attn.core.c_attn.weight")["lr"] == pytest.approx(0.25e-4)


@pytest.mark.parametrize("tied", ["true", "false"])
def test_mup_init_keeps_the_embedding_and_readout_constant_and_scales_the_logits(tied):
    _, model, _ = built(*D256, f"model.tie_embeddings={tied}")
    base = 0.02 * math.sqrt(768 / 64)  # `auto` at d_base 64
    assert model.wte.weight.std().item() == pytest.approx(base, rel=0.02)
    assert model.lm_head.weight.std().item() == pytest.approx(base, rel=0.02)
    assert model.blocks[0].attn.core.c_attn.weight.std().item() == pytest.approx(base / 2, rel=0.02)  # d^-1/2
    assert model.readout_mult == 0.25
    x = torch.randint(0, VOCAB, (2, 16))
    logits, _ = model(x)
    model.readout_mult = 1.0
    torch.testing.assert_close(model(x)[0] * 0.25, logits)


def test_mup_init_follows_each_matrix_fan_in_ratio():
    """d 256, SwiGLU: c_proj's fan_in grows 192 -> 704, so its std is sqrt(192/704) of d_base's, not 1/2
    (4.4% apart); scaled_init's 1/sqrt(2L) = 1/2 on top (tiny: L = 2). q/k/v's fan_in grows 64 -> 256."""
    _, model, _ = built(*D256)
    base = 0.02 * math.sqrt(768 / 64)  # `auto` at d_base 64
    core = model.blocks[0].mlp.core
    assert (core.c_proj.in_features, model.mup_fan_in_base["blocks.0.mlp.core.c_proj"]) == (704, 192)
    assert core.c_proj.weight.std().item() == pytest.approx(base * math.sqrt(192 / 704) / 2, rel=0.01)  # 0.01809
    assert core.c_fc.weight.std().item() == pytest.approx(base / 2, rel=0.01)
    assert model.blocks[0].attn.core.c_proj.weight.std().item() == pytest.approx(base / 4, rel=0.01)  # 0.01732
    assert built()[1].mup_fan_in_base == {} and built("model.param=mup")[1].mup_fan_in_base == {}  # sp, d_base


def test_completep_scales_branches_and_drops_the_depth_scaled_init():
    _, model, _ = built("model.param=completep", "model.n_layer=8", "model.mup_base_depth=2")
    subs = [b.attn for b in model.blocks] + [b.mlp for b in model.blocks]
    assert {s.branch_scale for s in subs} == {0.25}
    std = model.blocks[0].attn.core.c_attn.weight.std().item()
    assert model.blocks[0].attn.core.c_proj.weight.std().item() == pytest.approx(std, rel=0.05)  # no 1/sqrt(2L)


def test_completep_eps_takes_the_depth_factor_inside_the_branches_only():
    """d 256 (m = 4), L 8 (L/L_base = 4), untied head: a block's parameters eps / (m * L/L_base) = 1e-8/16;
    the embedding, the final norm and the head sit outside every branch (their gradients do not shrink with
    depth): eps / m = 1e-8/4 (EleutherAI/nanoGPT-mup; docs/mup.md)."""
    extra = ("model.n_layer=8", "optim.mup_eps=width", "model.tie_embeddings=false")
    _, model, opt = built(*D256[1:], "model.param=completep", *extra)
    for name in (
        "blocks.0.attn.core.c_attn.weight",
        "blocks.7.mlp.core.c_proj.weight",
        "blocks.3.attn.norm_in.weight",
        "blocks.3.mlp.norm_in.weight",
    ):
        assert group_of(opt, model, name)["eps"] == pytest.approx(1e-8 / 16), name
    for name in ("wte.weight", "ln_f.weight", "lm_head.weight"):
        assert group_of(opt, model, name)["eps"] == pytest.approx(1e-8 / 4), name
    assert sorted({g["eps"] for g in opt.param_groups}) == pytest.approx([1e-8 / 16, 1e-8 / 4])


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["arch=ngpt", "model.param=mup"], "nGPT is its own normalized parametrization"),
        (["arch=rezero", "model.param=mup"], "does not apply to arch=rezero"),
        (["model.param=mup", "optim=sgd"], "optim=sgd has none here"),
        (["model.param=mup", "model.d_model=128"], "set model.n_head=8"),
        (["model.param=mup", "model.d_ff=100"], "model.d_ff=null"),
        (["model.param=mup", "optim.decay_norm_in=true"], "set optim.decay_norm_in=false"),
        (["model.param=completep", "arch=post_ln"], "Pre-LN-family placements only"),
        (["model.param=completep", "arch=deepnorm"], "Pre-LN-family placements only"),
        (["model.param=completep", "arch=lns"], "Pre-LN-family placements only"),
        (["model.param=nope"], "choose one of: sp, mup, completep"),
        (["optim.mup_decay=half"], "choose one of: width, coupled, none"),
    ],
)
def test_what_mup_does_not_cover_is_refused_in_one_line(overrides, needle):
    with pytest.raises(ConfigError, match=r"^[^\n]*$") as exc:
        prepare(compose(["model=tiny", *overrides]))
    assert needle in str(exc.value)


@pytest.mark.parametrize(
    "extra",
    [
        ["arch=post_ln", "norm=layernorm"],
        ["arch=mix_ln", "model.n_layer=4"],
        ["arch=deepnorm"],
        ["arch=peri_ln", "norm=dyt"],
        ["arch=sandwich", "norm=seednorm"],
        ["arch=normformer", "norm=derf"],
        ["arch=hybridnorm"],
        ["arch=pre_ln", "arch.attn_gate=headwise", "model.tie_embeddings=false"],
    ],
)
def test_mup_trains_the_placements_and_norms_it_accepts(extra):
    out = losses(*D256[:1], "model.d_model=128", "model.n_head=8", *extra, steps=3)
    assert all(math.isfinite(v) for v in out) and out[-1] < out[0]


def test_param_kinds_not_names_decide():
    """A matrix growing on one side only (here: a hand-made readout inside a block) is refused, not guessed."""
    from normbench.model.mup import param_scales
    from normbench.optim.optimizers import base_shapes

    cfg, model, _ = built(*D256)
    kinds = param_kinds(model)
    base = base_shapes(model, cfg)
    model.blocks[0].attn.core.extra = torch.nn.Linear(256, 7, bias=False)
    kinds["blocks.0.attn.core.extra.weight"] = "matrix"
    with pytest.raises(ConfigError, match="has no counterpart at d_base"):
        param_scales(model, cfg, kinds, base)
    base["blocks.0.attn.core.extra.weight"] = (7, 64)  # fan_in grows, fan_out does not: a readout inside the net
    with pytest.raises(ConfigError, match="grows with width on one side only"):
        param_scales(model, cfg, kinds, base)


@pytest.mark.parametrize("param", ["mup", "completep"])
def test_hf_export_of_a_mup_model_is_exact(tmp_path, param):
    from test_export import SMALL, check_equivalent, make, roundtrip

    extra = ["model.d_model=64", "model.n_head=8", "model.mup_base_width=32", "model.mup_head_dim=8"]
    cfg, model = make([f"model.param={param}", "arch=pre_ln", "norm=rmsnorm", *extra])
    assert model.readout_mult == 0.5 and SMALL[0] == "model=tiny"
    kind, hf = roundtrip(tmp_path, model, cfg)
    assert kind == "custom"  # the stock Llama has no logit multiplier
    check_equivalent(model, hf)


def test_sandwich_with_seednorm_stores_its_gain_as_one_plus_w():
    _, model, _ = built("arch=sandwich", "norm=seednorm")
    norm = model.blocks[0].attn.norm_in
    assert norm.unit_offset == 1.0 and torch.all(norm.weight == 0.0)


def test_coordinate_check_mup_stays_in_the_band_and_sp_logits_leave_it():
    """Widths 32/64/128, 2 blocks, lr 1e-2, 5 steps, 2 seeds: the slopes at steps 3-5 (after the init's share of
    the logits, which muP shrinks like d^-1/2, has been overtaken by the updates)."""
    from normbench.diag.coordcheck import BAND, coord_check

    r = coord_check(["model=tiny", "trainer.batch_size=8"], [32, 64, 128], seeds=2, steps=5, lr=1e-2)
    for q, per_step in r["mup"]["slopes"].items():
        assert all(abs(s) <= BAND for s in per_step[2:]), (q, per_step)
    assert all(s > 3 * BAND for s in r["sp"]["slopes"]["logits"][2:]), r["sp"]["slopes"]["logits"]
    assert all(s > 3 * BAND for s in r["sp"]["slopes"]["resid"][2:])


@pytest.mark.slow  # 10-20 s on 2 shared cores
def test_depth_coordinate_check_completep_holds_the_residual_stream_that_sp_grows():
    """Depths 2/4/8 at d 64, lr 1e-2, 4 steps, seed 0: under SP the residual stream grows with depth (slope
    0.55-0.93 at steps 3-4 over seeds 0-2), under CompleteP it stays within +-0.2 (docs/mup.md)."""
    from normbench.diag.coordcheck import coord_check

    overrides = ["model=tiny", "trainer.batch_size=8", "model.mup_base_depth=2"]
    r = coord_check(overrides, [2, 4, 8], seeds=1, steps=4, lr=1e-2, depth=True)
    assert all(s > 0.45 for s in r["sp"]["slopes"]["resid"][2:]), r["sp"]["slopes"]["resid"]
    assert all(abs(s) <= 0.25 for s in r["completep"]["slopes"]["resid"][2:]), r["completep"]["slopes"]["resid"]
    assert r["completep"]["values"][8]["resid"][0] < r["completep"]["values"][2]["resid"][0]  # init: 1/L branches


def _lr_script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "scripts" / "mup_lr_transfer.py"
    spec = importlib.util.spec_from_file_location("mup_lr_transfer", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_lr_transfer_script_picks_the_best_lr_of_the_seed_mean_and_of_each_seed():
    script = _lr_script()
    # seed means 1.95 (1e-3) and 1.90 (2e-3); seed 0 is best at 2e-3 (1.8), seed 1 at 1e-3 (1.9)
    best = script.best_lrs({64: {1e-3: [2.0, 1.9], 2e-3: [1.8, 2.0]}})
    assert best[64] == {"lr": 2e-3, "loss": 1.9, "seeds": 2, "per_seed": [2e-3, 1e-3]}


def test_lr_transfer_script_adds_an_earlier_jsons_seed_0_where_its_runs_are_gone(tmp_path):
    import json

    script = _lr_script()
    for lr, seed, loss in ((1e-3, 1, 2.5), (2e-3, 1, 2.25), (2e-3, 0, 2.0)):
        where = script.run_dir(tmp_path / "out", "pre_ln", "sp", 64, lr, seed)
        where.mkdir(parents=True)
        (where / "summary.json").write_text(json.dumps({"status": "completed", "best_val_loss": loss}))
        (where / "cost.json").write_text(json.dumps({"cpu_s": 10.0}))
    prior = tmp_path / "prior.json"
    table = {"pre_ln": {"sp": {"64": {"0.001": [3.0], "0.002": [1.75]}}, "mup": {"64": {"0.001": [3.0]}}}}
    prior.write_text(json.dumps({"table": table}))
    data = script.collect(tmp_path / "out", prior)
    # 1e-3: seed 0 from the json, seed 1 run here; 2e-3: both run here, the json's seed 0 set against the rerun
    assert data["table"]["pre_ln"]["sp"][64] == {1e-3: [3.0, 2.5], 2e-3: [2.0, 2.25]}
    assert data["prior_points"] == 1 and data["cpu_s"] == 30.0
    assert data["rerun"] == [{"point": "pre_ln/sp/d64/lr0.002", "prior": 1.75, "rerun": 2.0}]
    assert "mup" not in data["table"]["pre_ln"] or 64 not in data["table"]["pre_ln"]["mup"]  # SP stands in there
