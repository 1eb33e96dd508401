"""Speed features on CPU: ``compile=true`` (slow: inductor compiles for ~20-60 s) and ``precision=bf16``."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from normbench import build, trainer
from normbench.config import ARCHS
from normbench.errors import ConfigError
from normbench.model import build_model

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


@pytest.mark.parametrize("arch", ARCHS)
def test_every_arch_compiles_to_one_graph_with_eager_gradients(arch):
    """compile=true for every arch: dynamo captures forward and backward whole (fullgraph: no
    graph break, so nothing falls back to Python per step) and the gradients equal eager mode.
    The aot_eager backend traces exactly what inductor would receive, without its codegen."""
    norm = "none" if arch == "ngpt" else "dyt"  # dyt: scalar parameters in the graph
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
