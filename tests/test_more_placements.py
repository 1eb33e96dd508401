"""The further placements (docs/architectures.md §3b) against their equations, written out here.

Like tests/test_model.py, every reference reads the model's weights by name and computes the
block with plain tensor code (never the model's own sublayers); small cases are worked by hand.
Parameters are randomized first, so a missing gain or a swapped norm cannot hide behind g = 1.
"""

from __future__ import annotations

import math

import pytest
import torch

from normbench.config import qk_norm_mode
from normbench.errors import ConfigError
from normbench.model.gpt import Attention
from normbench.rundir import check_resume_config
from test_model import (
    causal_softmax_attention,
    check_block,
    known_input,
    linear,
    make,
    randomize,
    ref_mlp,
    ref_norm,
    ref_rope,
)

from conftest import compose


def norm_cfg(name: str = "rmsnorm", eps: float = 1e-12):
    cfg = compose(["model=tiny", f"norm={name}"])
    cfg.norm.eps = eps
    return cfg.norm


# ------------------------------------------------------------------------------ arch.qk_norm
def ref_attention_width(x, core, n_head):
    """OLMo 2: q = N_q(W_q x), k = N_k(W_k x) over the whole width d, then heads, then RoPE."""
    B, T, C = x.shape
    hd = C // n_head
    q, k, v = linear(x, core.c_attn).split(C, dim=-1)
    q, k = ref_norm(core.q_norm, q), ref_norm(core.k_norm, k)
    q, k, v = (t.reshape(B, T, n_head, hd) for t in (q, k, v))
    return linear(causal_softmax_attention(ref_rope(q), ref_rope(k), v, 1.0 / math.sqrt(hd)), core.c_proj)


@pytest.mark.parametrize(("mode", "logit"), [("width", 2 * 2**0.5), ("head", 2**0.5), ("none", 25 / 2**0.5)])
def test_qk_norm_modes_by_hand(mode, logit):
    """q = k = x = (3, 4, 0, 0), two heads of 2, one token (RoPE is the identity at position 0).

    width: RMS over all 4 = 2.5, q = (1.2, 1.6, 0, 0), head 1 logit (1.44 + 2.56)/sqrt(2) = 2 sqrt(2).
    head:  head 1 normed alone, RMS sqrt(12.5): |q1|^2 = 2, logit 2/sqrt(2) = sqrt(2) (head 2 is 0).
    none:  logit (9 + 16)/sqrt(2).
    """
    core = Attention(4, 2, False, 0.0, norm_cfg(), mode != "none", False, qk_width=mode == "width")
    assert (core.q_norm is None) == (mode == "none")
    if mode != "none":
        assert core.q_norm.weight.shape == ((4,) if mode == "width" else (2,))
    with torch.no_grad():
        core.c_attn.weight.copy_(torch.eye(4).repeat(3, 1))
    core.stats = {}
    with torch.no_grad():
        core(torch.tensor([[[3.0, 4.0, 0.0, 0.0]]]), None)
    assert core.stats["attn_logit_max"].item() == pytest.approx(logit, rel=1e-5)


@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
def test_qk_norm_width_block_equation(norm):
    model, cfg = make("arch=pre_ln", f"norm={norm}", "arch.qk_norm=width", "model.n_layer=1")
    randomize(model)
    block, x = model.blocks[0], known_input()
    core = block.attn.core
    assert core.q_norm.weight.shape == (32,) and core.k_norm.weight.shape == (32,) and core.v_norm is None
    a, m = block.attn, block.mlp
    h = x + ref_attention_width(ref_norm(a.norm_in, x), core, 4)
    check_block(block, model.rope(x.device), x, h + ref_mlp(ref_norm(m.norm_in, h), m.core))
    # selective: statistics per head (same gains, reshaped) give another block output
    B, T, C = x.shape
    hx = ref_norm(a.norm_in, x)
    q, k, v = linear(hx, core.c_attn).split(C, dim=-1)
    pairs = ((core.q_norm, q), (core.k_norm, k))
    q, k = (ref_norm(_stats_only(n), t.reshape(B, T, 4, 8)) * n.weight.reshape(4, 8) for n, t in pairs)
    per_head = linear(causal_softmax_attention(ref_rope(q), ref_rope(k), v.reshape(B, T, 4, 8), 8**-0.5), core.c_proj)
    assert (per_head - ref_attention_width(hx, core, 4)).abs().max() > 1e-3


def _stats_only(norm):
    """The same norm class and eps without gain or bias."""
    return type(norm)(8, eps=norm.eps, affine=False)


@pytest.mark.parametrize(("given", "mode"), [("true", "head"), ("false", "none"), ("head", "head"), ("width", "width")])
def test_qk_norm_old_booleans_still_read(given, mode):
    model, cfg = make(f"arch.qk_norm={given}", "model.n_layer=1")
    assert qk_norm_mode(cfg.arch.qk_norm) == mode
    core = model.blocks[0].attn.core
    assert (core.q_norm is not None) == (mode != "none") and core.qk_width == (mode == "width")


def test_qk_norm_bad_value_is_one_line():
    from normbench.config import validate

    with pytest.raises(ConfigError, match=r"^arch\.qk_norm='both' is not allowed; choose one of: none, head, width$"):
        validate(compose(["model=tiny", "arch.qk_norm=both"]))


def test_old_checkpoint_with_boolean_qk_norm_resumes(tmp_path):
    """A checkpoint saved with qk_norm false/true resumes under none/head and is refused under width."""
    assert check_resume_config({"arch.qk_norm": False}, {"arch.qk_norm": "none"}, [], tmp_path) == []
    assert check_resume_config({"arch.qk_norm": "True"}, {"arch.qk_norm": "head"}, [], tmp_path) == []
    with pytest.raises(ConfigError, match="arch.qk_norm"):
        check_resume_config({"arch.qk_norm": True}, {"arch.qk_norm": "width"}, [], tmp_path)


def test_report_reads_old_qk_norm_runs_as_new_names(tmp_path):
    from normbench.report.loading import Run, setting
    from normbench.reproduce.measure import select

    def run(value):
        return Run(tmp_path, {"arch": {"name": "pre_ln", "qk_norm": value}}, [], {}, [])

    old, new = run(True), run("head")
    assert setting(old, "arch.qk_norm") == setting(new, "arch.qk_norm") == "head"
    assert setting(run(False), "arch.qk_norm") == "none"
    assert select([old, new, run(False)], {"arch.qk_norm": True}) == [old, new]


def test_export_refuses_width_qk_norm():
    from normbench.export import build_hf_model

    model, cfg = make("arch.qk_norm=width", "model.n_layer=1")
    with pytest.raises(ConfigError, match=r"^export: not supported yet: arch.qk_norm=width"):
        build_hf_model(model, cfg, 256)
