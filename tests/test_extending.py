"""docs/extending.md's recipe, as written: its example norm, copied out of the page into a temporary plugin
directory, is validated, trained end to end, decayed, diagnosed, reported and exported as a built-in norm is."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

from normbench.model import build_model
from normbench.model.kinds import param_kinds
from normbench.norm.norm_api import NORM_CLASSES, NORMS, Norm, register_norm
from normbench.optim.optimizers import build_optimizer
from normbench.validation import to_config

from conftest import REPO, TINY, compose, run_cli

DOC = REPO / "docs" / "extending.md"

# run in the plugin's process: what the optimizer's groups and the model make of the declared norm
GROUPS_SCRIPT = """
import json, sys
import softcap_norm  # registers norm=softcap and its keys, as NORMBENCH_PLUGINS would
from normbench.config.files import compose_config
from normbench.model import build_model
from normbench.model.kinds import param_kinds
from normbench.optim.optimizers import build_optimizer
from normbench.validation import to_config

out = {}
for name, extra in (("plain", []), ("scalars", ["optim.decay_scalars=true"]), ("offset", ["arch.gain_offset=true"])):
    cfg = to_config(compose_config(["model=tiny", "norm.name=softcap", "norm.softcap_init=2.0", *extra]))
    model = build_model(cfg, 256)
    opt = build_optimizer(model, cfg, log=lambda *a: None)
    names = {id(p): n for n, p in model.named_parameters()}
    wd = {names[id(p)]: g["weight_decay"] for g in opt.param_groups for p in g["params"]}
    out[name] = {"wd": wd, "kinds": param_kinds(model), "ln_f": model.ln_f.weight.tolist(),
                 "offset": model.ln_f.unit_offset, "cap": model.ln_f.cap.item()}
print(json.dumps(out))
"""
LEAKY = "import softcap_norm\n\nsoftcap_norm.SoftCapNorm.leaks = classmethod(lambda cls, n: True)\n"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(), flags=re.S)


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    """The page's module and yaml in a plugin directory and a config directory, and the env that loads them."""
    root = tmp_path_factory.mktemp("plugin")
    (root / "plugins").mkdir()
    (root / "conf" / "norm").mkdir(parents=True)
    (root / "plugins" / "softcap_norm.py").write_text(_blocks("python")[0])
    (root / "plugins" / "softcap_leaky.py").write_text(LEAKY)
    (root / "conf" / "norm" / "softcap.yaml").write_text(_blocks("yaml")[0])
    path = os.pathsep.join([str(root / "plugins"), os.environ["PYTHONPATH"]])
    env = {"PYTHONPATH": path, "NORMBENCH_PLUGINS": "normbench_test_hooks,softcap_norm"}
    return root, env


@pytest.fixture(scope="module")
def trained(plugin):
    root, env = plugin
    run = root / "run"
    args = ["train", "--config-dir", str(root / "conf"), "norm=softcap", "norm.softcap_init=2.0", *TINY]
    proc = run_cli([*args, "trainer.max_steps=6", "diag.every=3", f"hydra.run.dir={run}"], cwd=root, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return run


def test_the_example_norm_trains_and_records_its_diagnostic_scalar(trained):
    records = [json.loads(line) for line in (trained / "metrics.jsonl").read_text().splitlines()]
    diag = [r for r in records if "norm_cap_attn" in r]
    assert diag, records[0].keys()
    assert len(diag[0]["norm_cap_attn"]) == len(diag[0]["norm_cap_mlp"]) == 2  # one per block (model=tiny)
    assert diag[0]["norm_cap_final"] == pytest.approx(2.0, abs=0.1)  # norm.softcap_init, one step in
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in records if "loss" in r)


def test_the_example_norm_is_grouped_decayed_and_offset_by_its_declarations(plugin):
    root, env = plugin
    proc = subprocess.run(
        [sys.executable, "-c", GROUPS_SCRIPT],
        cwd=root,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    plain = out["plain"]
    assert plain["kinds"]["ln_f.cap"] == "scalar" and plain["kinds"]["ln_f.weight"] == "norm_in"
    assert plain["wd"]["ln_f.cap"] == plain["wd"]["blocks.0.attn.norm_in.weight"] == 0.0  # not decayed
    assert plain["wd"]["blocks.0.attn.core.c_attn.weight"] == 0.1  # the matrices are
    assert out["scalars"]["wd"]["ln_f.cap"] == 0.1  # optim.decay_scalars reads the declared kind
    assert plain["cap"] == 2.0 and set(plain["ln_f"]) == {1.0}
    assert out["offset"]["offset"] == 1.0 and set(out["offset"]["ln_f"]) == {0.0}  # has_gain: stored as 1 + w


@pytest.mark.slow
def test_the_example_norms_keys_are_checked_in_one_line(plugin):
    root, env = plugin
    proc = run_cli(["train", "norm.name=softcap", "norm.softcap_init=-1"], cwd=root, env=env)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "normbench: error: norm.softcap_init=-1.0 must be > 0"
    proc = run_cli(["list", "norm"], cwd=root, env=env)  # registered in code: listed without a conf file
    assert "softcap" in proc.stdout and "choose with norm.name=softcap" in proc.stdout


@pytest.mark.slow
def test_the_report_flags_the_example_only_when_it_declares_a_leak(plugin, trained):
    root, env = plugin
    for plugins, leaks in (("softcap_norm", False), ("softcap_norm,softcap_leaky", True)):
        out = root / f"report-{leaks}"
        proc = run_cli(
            ["report", str(trained), "--no-figures", "--out", str(out)],
            cwd=root,
            env={**env, "NORMBENCH_PLUGINS": plugins},
        )
        assert proc.returncode == 0, proc.stderr
        assert ("leaks the future" in (out / "report.md").read_text()) is leaks


@pytest.mark.slow
def test_export_refuses_the_example_norm_in_one_line(plugin, trained):
    root, env = plugin
    proc = run_cli(["export", str(trained), str(root / "hf")], cwd=root, env=env)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "SoftCapNorm" in lines[0] and "not supported" in lines[0], proc.stderr


class _GatedNorm(Norm):
    """RMSNorm times a sigmoid gate computed by a Linear of its own (initialised to zero: gate 0.5)."""

    PARAM_KINDS = {"gate.weight": "scalar"}

    def __init__(self, dim: int):
        super().__init__()
        self.gate = nn.Linear(dim, 1, bias=True)
        nn.init.zeros_(self.gate.weight)
        nn.init.constant_(self.gate.bias, 0.25)

    @classmethod
    def from_config(cls, n, dim, alpha):
        return cls(dim)

    def forward(self, x):
        return nn.functional.rms_norm(x, x.shape[-1:]) * torch.sigmoid(self.gate(x))


def test_a_norms_own_linear_keeps_its_init_and_the_norms_groups(monkeypatch):
    """The model's init draws only its own matrices; a Linear inside a norm is the norm's (its kinds, no decay)."""
    monkeypatch.setitem(NORMS, "test_gated", None)  # both registry entries removed again after the test
    monkeypatch.setitem(NORM_CLASSES, "test_gated", Norm)
    register_norm("test_gated")(_GatedNorm)
    cfg = to_config(compose(["model=tiny"]))
    cfg.norm.name = "test_gated"
    model = build_model(cfg, 256)
    gates = [m.gate for m in model.modules() if isinstance(m, _GatedNorm)]
    assert gates and all(g.weight.abs().sum() == 0 and (g.bias == 0.25).all() for g in gates)
    kinds = param_kinds(model)
    assert kinds["ln_f.gate.weight"] == "scalar" and kinds["ln_f.gate.bias"] == "norm_in"
    wd = {
        id(p): g["weight_decay"]
        for g in build_optimizer(model, cfg, log=lambda *a: None).param_groups
        for p in g["params"]
    }
    assert all(wd[id(p)] == 0.0 for g in gates for p in g.parameters())
