"""Every registered arch x norm that trains exports, and a process without normbench computes it.

For each combination of the registries (``normbench.validation.ARCHS`` x ``NORMS``, the pairs
validation and ``check_combination`` accept; nGPT and the archs that ignore ``norm=`` once) plus
the options that change what a block computes (width and per-head QK-norm, gates, FixNorm, ``1 + w``
gains, NormFormer's residual scale, SeeDNorm's slices and final norm, PowerNorm's groups, ...), a
tiny model is trained a few steps (so gains, scalars and running statistics have left their init),
exported as ``export`` would (stock class or custom), and its logits are saved. One child process,
where ``import normbench`` fails, loads every export with ``AutoModelForCausalLM`` and checks: fp32
logits within 1e-5 of normbench's; a forced continuation (a prompt, then one token at a time
through ``past_key_values``) equal to the full forward; cast to float64, logits within 1e-12
relative of normbench's float64 model (custom class: it computes in the model's dtype; the stock
Llama/Qwen3 classes compute their RMSNorm in fp32 whatever the dtype, so only fp32 is checked there).
A model class export does not know (a plugin's own blocks) is refused in one line.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from normbench.errors import ConfigError
from normbench.export import build_hf_model
from normbench.export.custom import write_code
from normbench.model import build_model, check_combination
from normbench.validation import ARCHS, NORMS, validate

from conftest import compose

pytestmark = pytest.mark.slow

VOCAB, T = 64, 20
SMALL = ["model=tiny", "model.d_model=32", "model.n_head=4", "model.n_layer=3", f"model.seq_len={T}"]
IGNORE_NORM = ("ngpt", "rezero", "fixup", "tfixup")  # one run each: the arch ignores norm=
OPTIONS = [
    ["arch=pre_ln", "norm=rmsnorm", "arch.qk_norm=width"],
    ["arch=pre_ln", "norm=layernorm", "arch.qk_norm=width", "model.bias=true"],
    ["arch=pre_ln", "norm=rmsnorm", "arch.qk_norm=head"],  # Qwen3
    ["arch=pre_ln", "norm=layernorm", "model.pos=learned", "model.mlp=gelu", "model.bias=true"],  # GPT-2
    ["arch=peri_ln", "norm=dyt", "arch.attn_gate=headwise"],
    ["arch=pre_ln", "norm=rmsnorm", "arch.attn_gate=elementwise", "model.bias=true"],
    ["arch=pre_ln", "norm=rmsnorm", "model.fixnorm=true"],
    ["arch=post_ln", "norm=layernorm", "model.fixnorm=true", "model.tie_embeddings=false"],
    ["arch=pre_ln", "norm=layernorm", "arch.gain_offset=true", "arch.qk_norm=head"],
    ["arch=peri_ln", "norm=derf", "arch.gain_offset=true", "arch.embed_norm=true"],
    ["arch=normformer", "norm=layernorm", "arch.scale_resids=true", "model.mlp=relu"],
    ["arch=sandwich", "norm=rmsnorm", "arch.qk_norm=head", "model.pos=learned"],
    ["arch=pre_ln", "norm=seednorm", "norm.seed_final=true", "norm.seed_heads=2"],
    ["arch=pre_ln", "norm=powernorm", "norm.pn_groups=2", "norm.affine=false"],
    ["arch=pre_ln", "norm=batchnorm", "norm.allow_leak=true", "norm.bias=false"],
    ["arch=pre_ln", "norm=scalenorm", "norm.affine=false"],
    ["arch=pre_ln", "norm=crmsnorm", "norm.affine=true"],
    ["arch=pre_ln", "norm=dyt", "norm.embed_scale=true", "model.tie_embeddings=false"],
    ["arch=lns", "norm=rmsnorm", "arch.qk_norm=width", "model.n_layer=4"],
    ["arch=simplenorm", "norm=layernorm", "model.pos=learned", "model.mlp=gelu", "model.bias=true"],
    ["arch=rezero", "norm=none", "model.fixnorm=true", "model.pos=learned"],
    ["arch=fixup", "norm=none", "model.mlp=relu", "model.bias=true", "model.tie_embeddings=false"],
    ["arch=tfixup", "norm=none", "model.pos=learned", "model.tie_embeddings=false"],
]


def _valid(overrides: list[str]):
    """The config, or None where training refuses it (validation, check_combination)."""
    extra = ["norm.allow_leak=true"] if "norm=batchnorm" in overrides else []  # its leak, acknowledged
    try:
        cfg = compose([*SMALL, *overrides, *extra])
        validate(cfg)
        check_combination(cfg)
    except ConfigError:
        return None
    return cfg


def cases() -> dict[str, list[str]]:
    found = {}
    for arch in ARCHS:
        for norm in NORMS[:1] if arch in IGNORE_NORM else NORMS:
            if _valid([f"arch={arch}", f"norm={norm}"]) is not None:
                found[f"{arch}-{norm}"] = [f"arch={arch}", f"norm={norm}"]
    for i, overrides in enumerate(OPTIONS):
        found[f"option{i}"] = overrides
    return found


def trained(cfg, steps: int = 4):
    """The model after ``steps`` AdamW steps on random tokens (gains, scalars, running statistics move)."""
    torch.manual_seed(0)
    model = build_model(cfg, VOCAB)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-2, weight_decay=0.0)
    g = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(steps):
        idx = torch.randint(0, VOCAB, (4, T), generator=g)
        loss = model(idx[:, :-1], idx[:, 1:])[1]
        opt.zero_grad()
        loss.backward()
        opt.step()
        model.after_step()
    return model.eval()


CHILD = r"""
import json, sys
sys.modules["normbench"] = None  # any import of normbench fails here
import torch
from transformers import AutoModelForCausalLM

root, names = sys.argv[1], json.loads(sys.argv[2])
out = {}
for name in names:
    ref = torch.load(f"{root}/{name}.pt")
    idx = ref["idx"]
    m = AutoModelForCausalLM.from_pretrained(f"{root}/{name}", trust_remote_code=True, dtype=torch.float32).eval()
    with torch.no_grad():
        full = m(input_ids=idx, use_cache=False).logits
        o = m(input_ids=idx[:, :5], use_cache=True)
        cache = getattr(o, "past_key_values", None) or getattr(o, "cache", None)
        parts = [o.logits]
        for t in range(5, idx.shape[1]):
            o = m(input_ids=idx[:, t : t + 1], past_key_values=cache, use_cache=True)
            cache = getattr(o, "past_key_values", None) or getattr(o, "cache", None)
            parts.append(o.logits)
        stepped = torch.cat(parts, dim=1)
        res = {
            "class": type(m).__name__,
            "fp32": float((full - ref["fp32"]).abs().max()),
            "scale": float(ref["fp32"].abs().max()),
            "cache": float((stepped - ref["fp32"]).abs().max()),
        }
        if "fp64" in ref:
            m = m.double()
            got = m(input_ids=idx, use_cache=False).logits
            assert got.dtype == torch.float64, got.dtype
            res["fp64"] = float((got - ref["fp64"]).abs().max() / ref["fp64"].abs().max())
    out[name] = res
print(json.dumps(out))
"""


def test_every_arch_norm_and_option_exports_and_loads_without_normbench(tmp_path):
    kinds = {}
    for name, overrides in cases().items():
        cfg = _valid(overrides)
        assert cfg is not None, overrides  # an OPTIONS entry that does not train is a typo
        model = trained(cfg)
        kind, hf = build_hf_model(model, cfg, VOCAB)
        hf.save_pretrained(tmp_path / name)
        if kind == "custom":
            write_code(tmp_path / name)
        kinds[name] = kind
        idx = torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            ref = {"idx": idx, "fp32": model(idx)[0]}
            if kind in ("custom", "gpt2"):
                ref["fp64"] = model.double()(idx)[0]
        torch.save(ref, tmp_path / f"{name}.pt")
    names = list(kinds)
    assert {n.split("-")[0] for n in names if "-" in n} == set(ARCHS)
    assert {n.split("-")[1] for n in names if n.startswith("pre_ln-")} == set(NORMS)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path), json.dumps(names)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    bad = {}
    for name, r in results.items():
        ok = r["fp32"] <= 1e-5 and r["cache"] <= 1e-5 * max(1.0, r["scale"]) and r["scale"] > 0.1
        ok = ok and r.get("fp64", 0.0) <= 1e-12 and (kinds[name] != "custom" or "fp64" in r)
        if not ok:
            bad[name] = r
    assert not bad, bad
    assert {kinds["option2"], kinds["option3"], kinds["pre_ln-rmsnorm"]} == {"qwen3", "gpt2", "llama"}
    assert sum(k == "custom" for k in kinds.values()) > 100


def test_a_model_class_export_does_not_know_is_refused_in_one_line():
    """A plugin placement whose blocks are its own class: refused by name, never a traceback."""
    from normbench.model.gpt import GPT

    class MyGPT(GPT):
        pass

    cfg = compose([*SMALL, "arch=pre_ln", "norm=rmsnorm"])
    model = MyGPT(cfg.model, cfg.arch, cfg.norm, VOCAB)
    for custom in (False, True):
        with pytest.raises(ConfigError) as exc:
            build_hf_model(model, cfg, VOCAB, custom=custom)
        assert str(exc.value).startswith("export: arch=pre_ln is not supported (its model class MyGPT is not one")
        assert "\n" not in str(exc.value)
