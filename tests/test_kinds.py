"""Parameter kinds are declared by the module that owns the parameter (normbench.model.kinds).

A norm layer defined only here, registered under a new name, gets the right kinds (its gain
``norm_in`` or ``norm_out`` by where the placement puts it, its bias and scalar their own)
and the right weight decay, with no other file touched. A parameter whose module declares
no kind is refused in one line.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from normbench.diag.diagnostics import Diagnostics
from normbench.model import build_model
from normbench.model.kinds import param_kinds
from normbench.norm.norms import NORMS, register_norm
from normbench.optim.optimizers import build_optimizer

from conftest import compose


class ScaleNorm(nn.Module):
    """ScaleNorm-like (Nguyen & Salazar 2019, arXiv:1910.05895): g * x / rms(x) + b, times a learned scalar."""

    PARAM_KINDS = {"gain": "norm", "offset": "bias", "alpha": "scalar"}
    diag_scalars = ("alpha",)  # what the diagnostics record (norm/norm_api.py): norm_alpha_<site>

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.gain = nn.Parameter(torch.ones(dim))
        self.offset = nn.Parameter(torch.zeros(dim))
        self.alpha = nn.Parameter(torch.full((1,), 0.7))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.alpha * self.gain * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) + self.offset


@pytest.fixture
def scalenorm(monkeypatch):
    monkeypatch.setitem(NORMS, "test_scalenorm", None)  # removed again after the test
    register_norm("test_scalenorm")(lambda cfg, dim, alpha: ScaleNorm(dim, cfg.eps))


def _model(arch: str, *overrides: str):
    cfg = compose(["model=tiny", f"arch={arch}", "norm=rmsnorm", *overrides])
    cfg.norm.name = "test_scalenorm"
    torch.manual_seed(0)
    return build_model(cfg, 256), cfg


def _decayed(opt) -> set[int]:
    return {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}


@pytest.mark.parametrize(
    ("arch", "norm_in", "norm_out"),
    [
        # Peri-LN: input norms and q/k norms and ln_f are inputs; output norms carry the sublayer output
        (
            "peri_ln",
            ["blocks.0.attn.norm_in", "blocks.1.mlp.norm_in", "blocks.0.attn.core.q_norm", "ln_f"],
            ["blocks.0.attn.norm_out", "blocks.1.mlp.norm_out"],
        ),
        # Post-LN: the norm after the residual add is the residual stream itself
        ("post_ln", ["blocks.0.attn.core.k_norm"], ["blocks.0.attn.norm_post", "blocks.1.mlp.norm_post"]),
        # HybridNorm: the FFN norm's output carries the residual (z = N(x + attn); x' = z + F(z))
        ("hybridnorm", ["blocks.0.attn.core.v_norm", "ln_f"], ["blocks.0.mlp.norm_in", "blocks.1.mlp.norm_in"]),
    ],
)
def test_a_norm_defined_in_a_test_gets_its_kinds_and_weight_decay(scalenorm, arch, norm_in, norm_out):
    model, cfg = _model(arch, "arch.qk_norm=true")
    kinds = param_kinds(model)
    norms = [m for m in model.modules() if isinstance(m, ScaleNorm)]
    assert norms, "the registered norm is used wherever the arch places one"
    for prefix in norm_in:
        assert kinds[f"{prefix}.gain"] == "norm_in", prefix
    for prefix in norm_out:
        assert kinds[f"{prefix}.gain"] == "norm_out", prefix
    ours = {n: k for n, k in kinds.items() if n.endswith((".gain", ".offset", ".alpha"))}
    assert len(ours) == 3 * len(norms)
    assert {k for n, k in ours.items() if n.endswith(".offset")} == {"bias"}
    assert {k for n, k in ours.items() if n.endswith(".alpha")} == {"scalar"}

    params = dict(model.named_parameters())
    # the default policy (wd 0.1 on matrices and the head only): none of the new norm's parameters
    decayed = _decayed(build_optimizer(model, cfg, log=lambda *_: None))
    assert decayed and not any(id(params[n]) in decayed for n in ours)
    # decay_norm_out: exactly the gains on the residual-output side join
    cfg.optim.decay_norm_out = True
    decayed = _decayed(build_optimizer(model, cfg, log=lambda *_: None))
    joined = {n for n in ours if id(params[n]) in decayed}
    assert joined == {f"{p}.gain" for p in _all(kinds, "norm_out")} and joined >= {f"{p}.gain" for p in norm_out}


def _all(kinds: dict[str, str], kind: str) -> set[str]:
    return {n.rsplit(".", 1)[0] for n, k in kinds.items() if k == kind and n.endswith(".gain")}


def test_diagnostics_read_the_new_norms_declared_scalar(scalenorm, monkeypatch):
    model, cfg = _model("pre_ln", "model.n_layer=2")
    diag = Diagnostics(cfg.diag, model, torch.zeros(1, 9, dtype=torch.long))
    with torch.no_grad():
        model.blocks[1].mlp.norm_in.alpha.fill_(0.25)
        model.ln_f.alpha.fill_(1.5)
    record = diag.collect()
    assert record["norm_alpha_attn"] == pytest.approx([0.7, 0.7])
    assert record["norm_alpha_mlp"] == pytest.approx([0.7, 0.25])
    assert record["norm_alpha_final"] == pytest.approx(1.5)
    monkeypatch.setattr(ScaleNorm, "diag_scalars", ())  # declared nothing: a scalar's name alone is not read
    assert not any(k.startswith("norm_alpha") for k in diag.collect())


def test_a_parameter_without_a_kind_is_refused():
    class Gate(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(3))

    model = nn.Sequential(nn.Linear(3, 3), Gate())
    with pytest.raises(ValueError, match=r"parameter 1\.w of Gate has no kind: give the class PARAM_KINDS"):
        param_kinds(model)
    assert param_kinds(nn.Sequential(nn.Linear(3, 3))) == {"0.weight": "matrix", "0.bias": "bias"}


def test_norm_registry_config_and_conf_files_name_the_same_norms():
    from normbench.config.files import config_dir
    from normbench.validation import NORMS as VALID

    files = {p.stem for p in (config_dir() / "norm").glob("*.yaml")}
    assert set(NORMS) == set(VALID) == files


def test_placement_registry_config_and_conf_files_name_the_same_archs():
    from normbench.config.files import config_dir
    from normbench.model.placement import PLACEMENTS
    from normbench.validation import ARCHS

    files = {p.stem for p in (config_dir() / "arch").glob("*.yaml")}
    assert set(PLACEMENTS) | {"ngpt"} == set(ARCHS) == files and "ngpt" not in PLACEMENTS
