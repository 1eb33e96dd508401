"""``attn_fp32``: under bf16 autocast the attention kernel runs in fp32 while the products stay bf16 (the claims'
CPU mode, claims/registry.CPU_MODE), and the dry run's estimate knows each execution form's speed."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from normbench.analysis.loading import load_run
from normbench.claims import registry
from normbench.claims.registry import CPU_MODES, claim_ids, cpu_mode, load_claim
from normbench.model import build_model
from normbench.model.attention import sdpa
from normbench.report.setup import LINES
from normbench.reproduce import estimate
from normbench.reproduce.plan import build
from normbench.runtime import precision
from normbench.train import trainer

from conftest import TINY, compose


def _qkv(dtype):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, 4, 16, 8, generator=g).to(dtype) for _ in range(3)]


def test_sdpa_fp32_is_the_fp32_kernel_on_the_upcast_inputs_cast_back():
    q, k, v = _qkv(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = sdpa(q, k, v, True, is_causal=True)
        plain = sdpa(q, k, v, False, is_causal=True)
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True).to(torch.bfloat16)
    assert out.dtype == torch.bfloat16 and torch.equal(out, want)
    assert plain.dtype == torch.bfloat16 and not torch.equal(plain, want)  # the bf16 kernel rounds otherwise
    q32, k32, v32 = _qkv(torch.float32)  # fp32 inputs: the flag changes nothing
    assert torch.equal(
        sdpa(q32, k32, v32, True, is_causal=True), F.scaled_dot_product_attention(q32, k32, v32, is_causal=True)
    )


class KernelDtypes(TorchDispatchMode):
    """The dtypes the attention kernel receives below autocast (autocast casts before the dispatch reaches here)."""

    def __init__(self):
        super().__init__()
        self.seen: list[torch.dtype] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if "scaled_dot_product" in func.__name__ and "backward" not in func.__name__:
            self.seen.append(args[0].dtype)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(("arch", "norm"), [("pre_ln", "layernorm"), ("ngpt", "none"), ("simplenorm", "rmsnorm")])
def test_attn_fp32_reaches_every_attention_kernel_and_keeps_the_products_bf16(arch, norm):
    idx = torch.randint(0, 256, (2, 16))
    for flag, kernel in ((False, torch.bfloat16), (True, torch.float32)):
        model = build_model(compose([*TINY, f"arch={arch}", f"norm={norm}", f"attn_fp32={str(flag).lower()}"]), 256)
        heads = []
        model.lm_head.register_forward_hook(lambda mod, inp, out, heads=heads: heads.append(out.dtype))
        with KernelDtypes() as spy, torch.autocast("cpu", dtype=torch.bfloat16):
            _, loss = model(idx, idx)
        loss.backward()
        n_layer = compose(TINY).model.n_layer
        assert spy.seen == [kernel] * n_layer, (flag, spy.seen)  # one kernel per block, in the asked dtype
        assert heads == [torch.bfloat16]  # the products stay in bf16 either way


def test_a_bf16_run_with_fp32_attention_learns_and_records_its_mode(tmp_path):
    cfg = compose(
        [
            *TINY,
            "precision=bf16",
            "attn_fp32=true",
            "trainer.batch_size=4",
            "trainer.max_steps=8",
            "trainer.log_every=1",
        ]
    )
    summary = trainer.run(cfg, tmp_path)
    seq = [json.loads(line)["loss"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert summary["status"] == "completed" and summary["precision"] == "bf16" and summary["attn_fp32"] is True
    assert seq[-1] < seq[0] - 0.3  # it learns
    assert "precision bf16, attention fp32" in (tmp_path / "train.log").read_text()  # the start-up line
    fp32 = trainer.run(compose([*TINY, "attn_fp32=true", "trainer.max_steps=1"]), tmp_path / "fp32")
    assert fp32["attn_fp32"] is False  # without autocast there is nothing to keep in fp32
    precision = dict(LINES)["precision"]  # the report's setup box
    assert precision(load_run(tmp_path)) == "bf16, attention kernel in fp32"
    assert precision(load_run(tmp_path / "fp32")) == "fp32"


@pytest.mark.parametrize("native", [True, False])
def test_every_claims_cpu_scale_trains_in_the_claims_mode_and_a_user_override_wins(tmp_path, monkeypatch, native):
    """The claims' mode follows the CPU: bf16 with the attention kernel in fp32 where bf16 products are native,
    fp32 where they are emulated (a few per cent of the fp32 rate); both compiled where it pays."""
    monkeypatch.setattr(registry, "cpu_native_bf16", lambda: native)
    mode = cpu_mode()
    assert mode == CPU_MODES["bf16" if native else "fp32"]
    assert CPU_MODES == {
        "bf16": ("precision=bf16", "attn_fp32=true", "compile=auto"),
        "fp32": ("precision=fp32", "attn_fp32=false", "compile=auto"),
    }
    for cid in claim_ids():
        fixed = load_claim(cid).sweep("cpu").fixed
        assert fixed[: len(mode)] == mode, cid
        assert "attn_fp32=true" not in load_claim(cid).sweep("quick").fixed, cid  # quick keeps eager fp32
    claim = load_claim("peri_variance")
    p = build(claim, "cpu", None, [], tmp_path, log=lambda *a: None)
    want = ("bf16", True, True) if native else ("fp32", False, True)  # 4,480 steps: compile=auto pinned to true
    assert {(c.precision, c.attn_fp32, c.compile) for _, c in p.pairs} == {want}
    fp32 = build(
        claim, "cpu", None, ["precision=fp32", "attn_fp32=false", "compile=false"], tmp_path, log=lambda *a: None
    )
    assert {(c.precision, c.attn_fp32, c.compile) for _, c in fp32.pairs} == {("fp32", False, False)}
    assert fp32.root != p.root  # another mode, other runs


@pytest.mark.parametrize("native", [True, False])
def test_the_estimate_divides_by_the_forms_measured_speed(monkeypatch, native):
    """Each form's speed as measured on its kind of CPU: with native bf16, bf16 + fp32 attention is the fastest;
    without, compiled fp32 is, and a bf16 form is slower than eager fp32."""
    monkeypatch.setattr(estimate, "cpu_rate", lambda: 4e10)
    monkeypatch.setattr(precision, "cpu_native_bf16", lambda: native)
    base = [*TINY, "trainer.max_steps=1000", "device=cpu"]
    eager = estimate.job_seconds(compose(base))[0] - estimate.START_S
    fast = estimate.job_seconds(compose([*base, "precision=bf16", "attn_fp32=true", "compile=true"]))[0]
    compiled_fp32 = estimate.job_seconds(compose([*base, "compile=true"]))[0]
    warm = estimate._compile_seconds("CPU")
    assert fast - estimate.START_S - warm == pytest.approx(eager / (1.71 if native else 0.20))
    assert compiled_fp32 - estimate.START_S - warm == pytest.approx(eager / (1.25 if native else 1.29))
    assert (fast < compiled_fp32) is native
    assert estimate.form_speedup(compose([*base, "attn_fp32=true"])) == 1.0  # fp32: the flag is idle
