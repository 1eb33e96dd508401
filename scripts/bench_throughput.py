"""Throughput benchmarks, measured side by side in one process and reported as ratios.

Suites (``--suite``, comma-separated; default all that fit the device):
- ``baseline``: normbench's trainer (pre_ln + layernorm, nanoGPT shape) against a
  minimal plain-PyTorch GPT training loop of the same shape written below
  (nanoGPT-style: random windows, AdamW, clip, step). Target >= 0.95x.
- ``archs``: tokens/s of every architecture relative to pre_ln on the same shape,
  and the share of nGPT's step time spent in its weight re-normalization.
- ``diag``: diag=default and diag=full (every 10 steps) against diag=off.
On CUDA (``--device cuda``): model gpt2_124m, bf16, optional ``--compile``,
tokens/s and MFU per architecture.

Each configuration runs ``--repeats`` times, interleaved (A B A B ...) so that
machine noise hits all alike; the median is reported. Timing excludes the first
``WARMUP`` steps, evaluation and checkpointing, as summary.json's tokens_per_s does.

    python scripts/bench_throughput.py                      # CPU, all suites
    python scripts/bench_throughput.py --suite baseline --repeats 5
    python scripts/bench_throughput.py --device cuda --compile --suite archs
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from normbench import trainer as nb_trainer  # noqa: E402
from normbench.cli import compose_config as compose  # noqa: E402
from normbench.data import load_data  # noqa: E402
from normbench.model import NANOGPT_SHAPE, padded_vocab  # noqa: E402

WARMUP = 5
ARCHS = ["pre_ln", "post_ln", "peri_ln", "mix_ln", "hybridnorm", "hybridnorm_star", "deepnorm", "ngpt"]


# --------------------------------------------------------------- the plain loop
class PlainBlock(nn.Module):
    def __init__(self, d: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.c_fc, self.mlp_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class PlainGPT(nn.Module):
    def __init__(self, vocab: int, d: int, n_layer: int, n_head: int, seq_len: int):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq_len, d)
        self.blocks = nn.ModuleList(PlainBlock(d, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def plain_loop(cfg, steps: int, device: str) -> float:
    """Tokens/s of the minimal loop, same shape and batch as ``cfg``."""
    torch.manual_seed(0)
    data = load_data(cfg.data, log=lambda *a: None).train
    m, t = cfg.model, cfg.trainer
    vocab = padded_vocab(cfg, load_data(cfg.data, log=lambda *a: None).vocab_size)
    model = PlainGPT(vocab, m.d_model, m.n_layer, m.n_head, m.seq_len).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1, foreach=True)
    # the same precision and compilation as the normbench side, so the ratio compares the loops
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.precision)
    autocast = (lambda: torch.autocast(device, dtype=dtype)) if dtype else contextlib.nullcontext
    scaler = torch.amp.GradScaler(device) if cfg.precision == "fp16" else None
    forward = torch.compile(model) if cfg.compile else model
    gen = torch.Generator().manual_seed(0)
    arange = np.arange(m.seq_len + 1)
    elapsed, tokens = 0.0, 0
    for step in range(steps):
        t0 = time.perf_counter()
        starts = torch.randint(len(data) - m.seq_len - 1, (t.batch_size,), generator=gen).numpy()
        chunk = torch.from_numpy(data[starts[:, None] + arange].astype(np.int64)).to(device)
        with autocast():
            loss = forward(chunk[:, :-1], chunk[:, 1:])
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
        else:
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 10 == 0:
            loss.item()  # the trainer syncs at its log steps too
        if device == "cuda":
            torch.cuda.synchronize()
        if step >= WARMUP:
            elapsed += time.perf_counter() - t0
            tokens += t.batch_size * m.seq_len
    return tokens / elapsed


def normbench_run(overrides: list[str], steps: int) -> dict:
    cfg = compose(
        [
            *overrides,
            f"trainer.max_steps={steps}",
            "trainer.eval_every=100000",
            "trainer.ckpt_every=100000",
            "trainer.log_every=10",
            "logger=jsonl",
        ]
    )
    with tempfile.TemporaryDirectory() as tmp:
        summary = nb_trainer.run(cfg, Path(tmp))
    return summary


def interleaved(configs: dict, repeats: int) -> dict[str, float]:
    """Median tokens/s per named config; each config is a zero-arg callable returning tokens/s."""
    results: dict[str, list[float]] = {name: [] for name in configs}
    for _ in range(repeats):
        for name, fn in configs.items():
            results[name].append(fn())
    return {name: statistics.median(v) for name, v in results.items()}


def quiet_logs() -> None:
    import logging

    logging.getLogger("normbench").disabled = True


# ---------------------------------------------------------------------- suites
def suite_baseline(args) -> None:
    shape = [
        f"model={args.model}",
        *NANOGPT_SHAPE,
        "diag=off",
        f"trainer.batch_size={args.batch}",
        f"device={args.device}",
        f"precision={args.precision}",
        f"compile={str(args.compile).lower()}",
    ]
    cfg = compose(shape)
    res = interleaved(
        {
            "plain loop": lambda: plain_loop(cfg, args.steps, args.device),
            "normbench": lambda: normbench_run(shape, args.steps)["tokens_per_s"],
        },
        args.repeats,
    )
    print(
        f"\n## baseline: normbench vs a plain PyTorch loop (model={args.model}, batch {args.batch}, "
        f"{args.steps} steps, median of {args.repeats})"
    )
    print("| loop | tokens/s | ratio |\n|---|---:|---:|")
    for name, tps in res.items():
        print(f"| {name} | {tps:,.0f} | {tps / res['plain loop']:.3f} |")


def suite_archs(args) -> None:
    common = [
        f"model={args.model}",
        "norm=rmsnorm",
        "diag=off",
        f"trainer.batch_size={args.batch}",
        f"device={args.device}",
        f"precision={args.precision}",
        f"compile={str(args.compile).lower()}",
    ]
    if args.device == "cuda":
        common.append("data.tokenizer=gpt2")
    summaries: dict[str, list[dict]] = {a: [] for a in ARCHS}
    for _ in range(args.repeats):
        for arch in ARCHS:
            summaries[arch].append(normbench_run([*common, f"arch={arch}"], args.steps))
    tps = {a: statistics.median(s["tokens_per_s"] for s in summaries[a]) for a in ARCHS}
    print(
        f"\n## archs: tokens/s relative to pre_ln (model={args.model}, norm=rmsnorm, batch {args.batch}, "
        f"median of {args.repeats})"
    )
    print("| arch | params | tokens/s | vs pre_ln | MFU |\n|---|---:|---:|---:|---:|")
    for a in ARCHS:
        mfu = statistics.median((s.get("mfu") or 0.0) for s in summaries[a])
        mfu_s = f"{100 * mfu:.1f}%" if mfu else "n/a"
        print(f"| {a} | {summaries[a][0]['n_params']:,} | {tps[a]:,.0f} | {tps[a] / tps['pre_ln']:.3f} | {mfu_s} |")
    renorm_share(args)


def renorm_share(args) -> None:
    """Share of an nGPT training step spent in normalize_matrices (on the `small` model)."""
    from normbench.model import build_model

    cfg = compose(["model=small", "arch=ngpt", f"device={args.device}"])
    device = torch.device(args.device)
    model = build_model(cfg, 256).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 256, (args.batch, cfg.model.seq_len + 1), device=device)
    step_t, renorm_t = [], []
    for i in range(args.steps):
        t0 = time.perf_counter()
        _, loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad()
        if device.type == "cuda":
            torch.cuda.synchronize()
        t1 = time.perf_counter()
        model.normalize_matrices()
        if device.type == "cuda":
            torch.cuda.synchronize()
        t2 = time.perf_counter()
        if i >= WARMUP:
            step_t.append(t2 - t0)
            renorm_t.append(t2 - t1)
    share = sum(renorm_t) / sum(step_t)
    print(
        f"\nnGPT weight re-normalization: {1e3 * statistics.median(renorm_t):.2f} ms of "
        f"{1e3 * statistics.median(step_t):.1f} ms per step = {100 * share:.1f}% of step time (model=small)"
    )


def suite_diag(args) -> None:
    common = [
        f"model={args.model}",
        "arch=pre_ln",
        "norm=rmsnorm",
        f"trainer.batch_size={args.batch}",
        f"device={args.device}",
        f"precision={args.precision}",
    ]
    res = interleaved(
        {
            name: (
                lambda name=name: normbench_run([*common, f"diag={name}", "diag.every=10"], args.steps)["tokens_per_s"]
            )
            for name in ("off", "default", "full")
        },
        args.repeats,
    )
    print(
        f"\n## diag: throughput with diagnostics every 10 steps vs off (model={args.model}, median of {args.repeats})"
    )
    print("| diag | tokens/s | vs off | cost |\n|---|---:|---:|---:|")
    for name, tps in res.items():
        r = tps / res["off"]
        print(f"| {name} | {tps:,.0f} | {r:.3f} | {100 * (1 - r):.1f}% |")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--suite", default="baseline,archs,diag", help="comma-separated: baseline,archs,diag")
    p.add_argument("--model", default=None, help="model config (default: small on CPU, gpt2_124m on CUDA)")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--precision", default=None, choices=["fp32", "bf16", "fp16"])
    args = p.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_throughput: error: --device cuda but no CUDA GPU is available", file=sys.stderr)
        return 2
    gpu = args.device == "cuda"
    args.model = args.model or ("gpt2_124m" if gpu else "small")
    args.batch = args.batch or (16 if gpu else 8)
    args.steps = args.steps or (50 if gpu else 40)
    args.precision = args.precision or ("bf16" if gpu else "fp32")
    quiet_logs()
    print(
        f"# normbench throughput, device={args.device} ({torch.cuda.get_device_name() if gpu else 'CPU'}), "
        f"torch {torch.__version__}, threads {torch.get_num_threads()}"
    )
    suites = args.suite.split(",")
    if bad := [s for s in suites if s not in ("baseline", "archs", "diag")]:
        p.error(f"unknown suite(s) {', '.join(bad)}; choose from baseline, archs, diag")
    for name in suites:
        {"baseline": suite_baseline, "archs": suite_archs, "diag": suite_diag}[name](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
