"""Speed features on CPU: ``compile=true|auto`` (inductor compiles for ~20-60 s: the graph checks use
dynamo's capture with the aot_eager backend instead) and ``precision=bf16``."""

from __future__ import annotations

import functools
import json

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.backends.debugging import aot_eager
from torch._dynamo.utils import counters

from normbench.errors import ConfigError
from normbench.model import build_model, check_combination
from normbench.runtime import compiling
from normbench.train import build, trainer
from normbench.validation import ARCHS, NORMS, validate

from conftest import TINY, compose


def losses(run_dir) -> list[float]:
    return [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["pre_ln", "ngpt"])
def test_compile_matches_eager(arch, tmp_path):
    """torch.compile changes speed, not results; nGPT's re-normalization runs outside the graph."""
    common = [*TINY, f"arch={arch}", "trainer.batch_size=2", "trainer.max_steps=3", "trainer.log_every=1", "diag=off"]
    eager = trainer.run(compose(common), tmp_path / "eager")
    compiled = trainer.run(compose([*common, "compile=true"]), tmp_path / "compiled")
    assert compiled["status"] == "completed"
    assert losses(tmp_path / "compiled") == pytest.approx(losses(tmp_path / "eager"), rel=1e-3)
    assert compiled["final_val_loss"] == pytest.approx(eager["final_val_loss"], rel=1e-3)
    if arch == "ngpt":  # the checkpoint's matrices are back on the unit sphere after the last step
        state = torch.load(tmp_path / "compiled" / "checkpoints" / "last.pt", weights_only=True)["model"]
        w = state["blocks.0.att_c_proj.weight"]
        assert torch.allclose(w.norm(dim=0), torch.ones(w.shape[1]), atol=1e-5)


# Pre-LN, HybridNorm (q/k norms) and nGPT (its own geometry) in the default suite, every other arch in the slow one
COMPILE_DEFAULT = ("pre_ln", "hybridnorm", "ngpt")


@pytest.mark.parametrize(
    "arch", [pytest.param(a, marks=() if a in COMPILE_DEFAULT else pytest.mark.slow) for a in ARCHS]
)
def test_every_arch_compiles_to_one_graph_with_eager_gradients(arch):
    """compile=true for every arch: dynamo captures forward and backward whole (fullgraph: no
    graph break, so nothing falls back to Python per step) and the gradients equal eager mode.
    The aot_eager backend traces exactly what inductor would receive, without its codegen."""
    norm = {"ngpt": "none", "simplenorm": "rmsnorm"}.get(arch, "dyt")  # dyt: scalar parameters in the graph
    torch.manual_seed(0)
    model = build_model(compose([*TINY, f"arch={arch}", f"norm={norm}", "model.n_layer=4"]), 256)
    idx = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    _, loss = model(idx, idx.roll(-1, dims=1))
    loss.backward()
    eager = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    _, loss_c = torch.compile(model, backend="aot_eager", fullgraph=True)(idx, idx.roll(-1, dims=1))
    loss_c.backward()
    assert loss_c.item() == pytest.approx(loss.item(), rel=1e-6)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, eager[n], rtol=1e-5, atol=1e-7, msg=n)


def test_bf16_trains_on_cpu(tmp_path):
    cfg = compose([*TINY, "precision=bf16", "trainer.batch_size=4", "trainer.max_steps=8", "trainer.log_every=1"])
    summary = trainer.run(cfg, tmp_path)
    seq = losses(tmp_path)
    assert summary["status"] == "completed" and summary["precision"] == "bf16"
    assert seq[-1] < seq[0] - 0.3  # it learns
    # fp32 master weights: the optimizer state and the checkpoint stay fp32
    state = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)
    assert all(v.dtype == torch.float32 for v in state["model"].values())


@pytest.mark.parametrize(("arch", "norm"), [("pre_ln", "rmsnorm"), ("peri_ln", "layernorm"), ("ngpt", "none")])
def test_bf16_autocast_norm_statistics_in_fp32(arch, norm, monkeypatch):
    """Under bf16 autocast the matmuls run in bf16, every normalization reduces in fp32."""
    seen: list[torch.dtype] = []
    for name in ("rms_norm", "layer_norm", "normalize"):
        real = getattr(F, name)

        def spy(x, *args, _real=real, **kwargs):
            seen.append(x.dtype)
            return _real(x, *args, **kwargs)

        monkeypatch.setattr(F, name, spy)
    model = build_model(compose([*TINY, f"arch={arch}", f"norm={norm}"]), 256)
    head_dtype = []
    model.lm_head.register_forward_hook(lambda mod, inp, out: head_dtype.append(out.dtype))
    idx = torch.randint(0, 256, (2, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, loss = model(idx, idx)
    assert head_dtype == [torch.bfloat16]  # autocast is on: the matmuls run in bf16
    assert loss.dtype == torch.float32
    assert seen and set(seen) == {torch.float32}, seen


def test_fp16_refused_on_cpu():
    with pytest.raises(ConfigError, match="fp16 needs a CUDA GPU"):
        build.resolve_device(compose([*TINY, "precision=fp16", "device=cpu"]))


# ----------------------------------------------------------- graphs: no breaks, no recompiles
def train_compiled(tmp_path, monkeypatch, arch: str, norm: str, aot: bool = True) -> list:
    """A compile=true, diag=default training run whose torch.compile captures with aot_eager
    (what inductor would receive, forward and backward, without its codegen) or, ``aot=False``,
    with dynamo alone (graph breaks and guards are dynamo's; faster); returns the graphs compiled."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return aot_eager(gm, example_inputs) if aot else gm.forward

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend=backend))
    torch._dynamo.reset()
    counters.clear()
    overrides = [*TINY, f"arch={arch}", f"norm={norm}", "compile=true", "diag=default", "diag.every=2"]
    overrides += ["trainer.batch_size=2", "trainer.max_steps=5", "trainer.eval_every=2", "trainer.eval_batches=1"]
    summary = trainer.run(compose(overrides), tmp_path)
    assert summary["status"] == "completed"
    return graphs


def assert_two_graphs(graphs) -> None:
    """One training graph and one evaluation (no-grad) graph, each whole: a graph break would add
    graphs and break counts; a recompile after warm-up (a guard on something that changes per step)
    would add a graph at every later train/eval switch or diagnostic step."""
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert len(graphs) == 2, [g.code[:200] for g in graphs]


# q/k/v norms with DyT's scalar parameters; nGPT's scaled vectors and its re-normalization after the step
REPRESENTATIVE = [("hybridnorm", "dyt"), ("ngpt", "rmsnorm")]


@pytest.mark.parametrize(("arch", "norm"), REPRESENTATIVE)
def test_compiled_training_has_no_graph_break_or_recompile(arch, norm, tmp_path, monkeypatch):
    """compile=true + diag=default: 5 steps with evaluations every 2 steps and diagnostics every 2
    (they run on the uncompiled module) compile exactly two graphs."""
    assert_two_graphs(train_compiled(tmp_path, monkeypatch, arch, norm))


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_compiled_training_every_arch_and_norm(arch, tmp_path, monkeypatch):
    """The full registry (archs and norms added later included): the same check for every arch x
    norm that a config accepts (nGPT has no norm layers: its default only; batchnorm without
    norm.allow_leak is refused, so never compiled)."""
    checked = []
    for norm in ["rmsnorm"] if arch == "ngpt" else NORMS:
        if (arch, norm) in REPRESENTATIVE:
            continue
        try:
            cfg = compose([*TINY, f"arch={arch}", f"norm={norm}"])
            validate(cfg)
            check_combination(cfg)
        except ConfigError:
            continue
        graphs = train_compiled(tmp_path / norm, monkeypatch, arch, norm, aot=False)
        try:
            assert_two_graphs(graphs)
        except AssertionError as exc:
            raise AssertionError(f"arch={arch} norm={norm}: {exc}") from None
        checked.append(norm)
    assert checked or arch == "ngpt"


# -------------------------------------------------------------------------- compile=auto
def test_compile_auto_compiles_only_runs_that_repay_it():
    """The rule of normbench/runtime/compiling.py, computed by hand from its constants."""
    model = build_model(compose([*TINY]), 256)
    prof = compiling.PROFILES["cpu"]
    threads, d = torch.get_num_threads(), compose(TINY).model.d_model
    step_s = compiling.model_flops_per_token(model, compose(TINY).model) * 8 * 64 / (prof.eager_at(d) * threads)
    even = prof.compile_s / (step_s * prof.saving_at(d))  # steps at which the saving equals the compile time
    short = compose([*TINY, "compile=auto", f"trainer.max_steps={int(even * 0.9)}"])
    long = compose([*TINY, "compile=auto", f"trainer.max_steps={int(even * 1.1) + 1}"])
    cpu = torch.device("cpu")
    assert compiling.decide(short, model, cpu).compile is False
    decision = compiling.decide(long, model, cpu)
    assert decision.compile is True and decision.reason.startswith("compile=auto:")
    assert "compiling on cpu" in decision.reason
    for value, expected in ((True, True), (False, False)):
        assert compiling.decide(compose([*TINY, f"compile={str(value).lower()}"]), model, cpu).compile is expected


def test_compile_auto_on_cuda_uses_the_peak():
    """CUDA: 25% of the bf16 peak as eager throughput; a faster GPU makes a run shorter, so less worth it."""
    model = build_model(compose(TINY), 256)
    cuda = torch.device("cuda")  # decide() only reads the type and the peak (given: no CUDA call)
    prof = compiling.PROFILES["cuda"]
    fpt = compiling.model_flops_per_token(model, compose(TINY).model)
    peak = 1e12
    steps = int(prof.compile_s / (fpt * 8 * 64 / (prof.eager_flops * peak) * prof.saving)) + 10
    cfg = [*TINY, "compile=auto", f"trainer.max_steps={steps}"]
    assert compiling.decide(compose([*cfg, f"peak_flops={peak}"]), model, cuda).compile is True
    assert compiling.decide(compose([*cfg, f"peak_flops={peak * 2}"]), model, cuda).compile is False


def test_compile_value_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"^compile='maybe' is not allowed; choose one of: true, false, auto$"):
        validate(compose([*TINY, "compile=maybe"]))
    validate(compose([*TINY, "compile=auto"]))  # accepted


def test_compile_auto_stays_eager_without_a_cpp_compiler(monkeypatch):
    model = build_model(compose(TINY), 256)
    cfg = compose([*TINY, "compile=auto", "trainer.max_steps=10000000"])  # long enough to repay any compile
    assert compiling.decide(cfg, model, torch.device("cpu")).compile is True
    monkeypatch.setattr(compiling, "has_cpp_compiler", lambda: False)
    decision = compiling.decide(cfg, model, torch.device("cpu"))
    assert decision.compile is False and "no C++ compiler" in decision.reason
    assert compiling.decide(compose([*TINY, "compile=true"]), model, torch.device("cpu")).compile is True  # asked for


def test_the_cpu_rule_scales_the_eager_rate_and_the_saving_with_the_width():
    prof = compiling.PROFILES["cpu"]
    assert prof.ref_width == 64
    assert prof.eager_at(64) == prof.eager_flops and prof.saving_at(64) == prof.saving
    assert prof.eager_at(96) == pytest.approx(prof.eager_flops * 1.5)  # like d ...
    assert prof.eager_at(1024) == prof.eager_flops_max  # ... up to the products' own rate
    assert prof.saving_at(128) == pytest.approx(prof.saving / 2) and prof.saving_at(32) == prof.saving
    # a machine's measured rate at d 64 replaces the profile's; the cap keeps its ratio to it
    assert prof.eager_at(96, measured=2e10) == pytest.approx(3e10)
    assert prof.eager_at(1024, measured=2e10) == pytest.approx(2e10 * prof.eager_flops_max / prof.eager_flops)
    gpu = compiling.PROFILES["cuda"]
    assert gpu.eager_at(768) == gpu.eager_flops and gpu.saving_at(768) == gpu.saving  # constants there
