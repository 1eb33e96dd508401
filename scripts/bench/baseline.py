"""The baseline suite: normbench's trainer (pre_ln + layernorm, nanoGPT shape) against a minimal plain-PyTorch
GPT training loop of the same shape written below (nanoGPT-style: random windows, AdamW, clip, step)."""

from __future__ import annotations

import contextlib
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from bench.core import WARMUP, compose, interleaved, normbench_run
from normbench.data.corpus import load_data
from normbench.model import NANOGPT_SHAPE, padded_vocab


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
