"""Model FLOPs per token, device peaks, MFU, and the throughput keys in metrics.jsonl / summary.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from normbench.model import build_model
from normbench.runtime import flops


def test_flops_per_token_by_hand():
    # N = 1000 matmul params, L=2, d=8, T=16: 6*1000 + 12*2*8*16 = 6000 + 3072
    assert flops.flops_per_token(1000, 2, 8, 16) == 9072.0


def test_matmul_params_tied_and_untied():
    class Toy(nn.Module):
        def __init__(self, tie: bool, learned_pos: bool):
            super().__init__()
            self.wte = nn.Embedding(10, 4)  # 40
            self.wpe = nn.Embedding(6, 4) if learned_pos else None  # 24, look-up only
            self.proj = nn.Linear(4, 4, bias=True)  # 16 + 4
            self.gain = nn.Parameter(torch.ones(4))  # 4
            self.lm_head = nn.Linear(4, 10, bias=False)  # 40
            if tie:
                self.lm_head.weight = self.wte.weight

    # tied: the shared matrix counts once (as the head); the position table never counts
    assert flops.matmul_params(Toy(tie=True, learned_pos=True)) == 40 + 20 + 4
    # untied: the input embedding is a look-up, the head a matmul
    assert flops.matmul_params(Toy(tie=False, learned_pos=False)) == 20 + 4 + 40


def test_model_flops_per_token_tiny(tiny_cfg):
    cfg = tiny_cfg("model.n_layer=2", "model.d_model=64", "model.seq_len=64")
    model = build_model(cfg, 256)  # tied embeddings: all params are matmul params
    n = sum(p.numel() for p in model.parameters())
    assert flops.model_flops_per_token(model, cfg.model) == 6 * n + 12 * 2 * 64 * 64
    ngpt = build_model(tiny_cfg("arch=ngpt"), 256)  # untied: wte (256 x 64) is look-up only
    n = sum(p.numel() for p in ngpt.parameters()) - 256 * 64
    assert flops.matmul_params(ngpt) == n


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA A100 80GB PCIe", 312e12),
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H100 NVL", 835e12),
        ("NVIDIA H200", 989e12),
        ("NVIDIA GH200 480GB", 989e12),
        ("NVIDIA GeForce RTX 3090", None),
    ],
)
def test_gpu_peak_table(name, peak):
    assert flops.gpu_peak_flops(name) == peak


def test_peak_and_mfu_on_cpu():
    cpu = torch.device("cpu")
    assert flops.peak_flops(cpu) is None
    assert flops.peak_flops(cpu, 1e12) == 1e12
    assert flops.mfu(1e6, 1000.0, None) is None
    # 1e6 FLOPs/token x 1e5 tokens/s over 2 devices of 1e12 FLOP/s = 5%
    assert flops.mfu(1e6, 1e5, 1e12, devices=2) == pytest.approx(0.05)
    assert flops.peak_memory_gb(cpu) is None


def test_throughput_keys_in_metrics_and_summary(tiny_cfg, tmp_path):
    from normbench.train import trainer

    cfg = tiny_cfg("trainer.batch_size=2", "trainer.max_steps=7", "trainer.log_every=7", "diag=off", "peak_flops=1e12")
    summary = trainer.run(cfg, tmp_path)
    rec = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()][-1]
    fpt = summary["flops_per_token"]
    assert rec["step_time_s"] > 0 and rec["peak_mem_gb"] is None
    assert rec["mfu"] == pytest.approx(fpt * rec["tokens_per_s"] / 1e12)
    assert summary["mfu"] == pytest.approx(fpt * summary["tokens_per_s"] / 1e12)
    assert summary["step_time_s"] == pytest.approx(2 * 64 / summary["tokens_per_s"])
    assert summary["peak_flops"] == 1e12 and summary["peak_mem_gb"] is None


def test_benchmark_script_reports_both_loops_as_a_ratio(tmp_path):
    """scripts/bench_throughput.py, smallest size: the table has both loops, positive tokens/s, ratio 1 for the base."""
    import re
    import subprocess
    import sys

    script = Path(__file__).resolve().parent.parent / "scripts" / "bench_throughput.py"
    cmd = [sys.executable, str(script), "--suite", "baseline", "--model", "tiny", "--steps", "8", "--repeats", "1"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = dict(re.findall(r"^\| (plain loop|normbench) \| ([\d,]+) \| [\d.]+ \|$", proc.stdout, re.M))
    assert set(rows) == {"plain loop", "normbench"}, proc.stdout
    assert all(int(v.replace(",", "")) > 0 for v in rows.values())
    assert "| plain loop |" in proc.stdout and "| 1.000 |" in proc.stdout
