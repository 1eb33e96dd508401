"""Throughput benchmarks, measured side by side in one process and reported as ratios.

Suites (``--suite``, comma-separated; default baseline,archs,diag):
- ``baseline``: normbench's trainer (pre_ln + layernorm, nanoGPT shape) against a
  minimal plain-PyTorch GPT training loop of the same shape written below
  (nanoGPT-style: random windows, AdamW, clip, step). Target >= 0.95x.
- ``archs``: every registered architecture (``normbench.validation.ARCHS``) relative to pre_ln:
  tokens/s, model FLOP/s (tokens/s x FLOPs per token, ``normbench.runtime.flops``: a bigger MLP is
  not counted against an arch), peak memory (RSS growth of the run on CPU,
  ``torch.cuda.max_memory_allocated`` on CUDA) and the ratio of that peak to
  ``normbench.runtime.memory``'s estimate; then the share of nGPT's step spent re-normalizing weights.
- ``compile``: per architecture, eager against ``compile=true``: steady-state tokens/s and
  the compile time (the extra wall time a compiled run takes to reach its steady state,
  with a cold inductor cache); the numbers behind ``compile=auto`` (normbench/runtime/compiling.py).
- ``diag``: diag=default and diag=full (every 10 steps) against diag=off.
- ``paired``: each architecture and pre_ln built in one process and stepped in alternation
  (``--rounds`` rounds): the median of the per-round ratios and its quartiles, robust to a
  machine whose speed drifts (docs/performance.md §4).
``--set KEY=VALUE`` (repeatable) overrides every run of the archs, compile, diag and paired suites.
On CUDA (``--device cuda``): model gpt2_124m, bf16, optional ``--compile``, and MFU.

Each configuration runs ``--repeats`` times, interleaved (A B A B ...) so that
machine noise hits all alike; the median is reported. Timing excludes the first
``WARMUP`` steps, evaluation and checkpointing, as summary.json's tokens_per_s does.
The archs and compile suites run each training in a fresh process (``--worker``), so that
peak memory and compile time are those of that run alone.

    python scripts/bench_throughput.py                      # CPU, baseline, archs, diag
    python scripts/bench_throughput.py --suite baseline --repeats 5
    python scripts/bench_throughput.py --suite compile --archs pre_ln,ngpt
    python scripts/bench_throughput.py --suite paired --set model.d_model=512 --set model.n_head=8
    python scripts/bench_throughput.py --device cuda --compile --suite archs
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
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

from normbench.config.files import compose_config as compose  # noqa: E402
from normbench.data.corpus import load_data  # noqa: E402
from normbench.model import NANOGPT_SHAPE, padded_vocab  # noqa: E402
from normbench.runtime.throughput import WARMUP_STEPS as WARMUP  # noqa: E402  (the trainer's untimed steps)
from normbench.train import trainer as nb_trainer  # noqa: E402
from normbench.validation import ARCHS  # noqa: E402

STEPS_PER_ROUND = 2  # paired suite: steps of one model before switching to the other
RESULT = "BENCH_RESULT "  # the line a --worker prints its result on


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


# ------------------------------------------------------- isolated runs (worker)
def _proc_status(key: str) -> float | None:
    """A /proc/self/status field in bytes (VmRSS, VmHWM), None where there is no /proc."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _reset_peak_rss() -> bool:
    """Reset this process's peak RSS (VmHWM) to its current RSS (Linux: clear_refs 5)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def worker(spec: dict) -> dict:
    """One training run in this (fresh) process: its summary, peak memory and memory estimate.

    Peak memory: on CUDA ``torch.cuda.max_memory_allocated``; on CPU the growth of the
    resident set (peak RSS during the run minus RSS before it: the interpreter and torch are
    not counted), which is what the estimate of ``normbench.runtime.memory`` covers.
    """
    from normbench.data.corpus import load_data
    from normbench.runtime import memory

    quiet_logs()
    overrides, steps = spec["overrides"], spec["steps"]
    cfg = compose(overrides)
    vocab = padded_vocab(cfg, load_data(cfg.data, log=lambda *a: None).vocab_size)
    est = memory.estimate(cfg, vocab, cfg.device if cfg.device != "auto" else "cpu").total
    cuda = cfg.device == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        before = 0.0
    else:
        reset = _reset_peak_rss()
        before = _proc_status("VmRSS") if reset else None
    cpu_time = _count_cpu_time() if not cuda else None
    summary = normbench_run(overrides, steps)
    if cpu_time is not None and cpu_time["steps"]:
        tokens = cfg.trainer.batch_size * cfg.trainer.grad_accum * cfg.model.seq_len * cpu_time["steps"]
        summary["cpu_tokens_per_s"] = tokens / cpu_time["seconds"]
    if cuda:
        peak = float(torch.cuda.max_memory_allocated())
    else:
        hwm = _proc_status("VmHWM")
        peak = hwm - before if hwm is not None and before is not None else None
    return {"summary": summary, "peak_mem": peak, "mem_estimate": est}


def _count_cpu_time() -> dict:
    """Count this process's CPU time (``time.process_time``) over the steady-state steps (after
    ``WARMUP``): forward, backward, clip, optimizer step and nGPT's re-normalization, as the
    wall-clock tokens/s does. With one torch thread, tokens per CPU-second hardly depends on what
    else the machine runs, where tokens per wall-second does (both are printed)."""
    acc = {"steps": 0, "seconds": 0.0, "calls": 0, "t0": 0.0}
    cls = nb_trainer.Trainer
    train_step, optimizer_step = cls.train_step, cls.optimizer_step

    def timed_train_step(self, *a, **k):
        acc["t0"] = time.process_time()
        return train_step(self, *a, **k)

    def timed_optimizer_step(self, *a, **k):
        out = optimizer_step(self, *a, **k)
        acc["calls"] += 1
        if acc["calls"] > WARMUP:
            acc["steps"] += 1
            acc["seconds"] += time.process_time() - acc["t0"]
        return out

    cls.train_step, cls.optimizer_step = timed_train_step, timed_optimizer_step
    return acc


def isolated(overrides: list[str], steps: int, env: dict | None = None) -> dict:
    """:func:`worker` in a subprocess; raises with its output when it fails."""
    spec = json.dumps({"overrides": overrides, "steps": steps})
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", spec],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT):
            return json.loads(line[len(RESULT) :])
    raise RuntimeError(f"worker {overrides} failed ({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")


def _common(args, compile_: bool | None = None) -> list[str]:
    out = [
        f"model={args.model}",
        "norm=rmsnorm",
        "diag=off",
        f"trainer.batch_size={args.batch}",
        f"device={args.device}",
        f"precision={args.precision}",
        f"compile={str(args.compile if compile_ is None else compile_).lower()}",
    ]
    if args.device == "cuda":
        out.append("data.tokenizer=gpt2")
    return out + args.set


def _mb(b: float | None) -> str:
    return "n/a" if b is None else f"{b / 2**20:,.0f} MB"


def suite_archs(args) -> None:
    archs = args.archs
    common = _common(args)
    results: dict[str, list[dict]] = {a: [] for a in archs}
    for _ in range(args.repeats):
        for arch in archs:
            results[arch].append(isolated([*common, f"arch={arch}"], args.steps))

    def med(arch, fn):
        vals = [v for v in (fn(r) for r in results[arch]) if v is not None]
        return statistics.median(vals) if vals else None

    tps = {a: med(a, lambda r: r["summary"]["tokens_per_s"]) for a in archs}
    cpu = {a: med(a, lambda r: r["summary"].get("cpu_tokens_per_s")) for a in archs}
    fps = {a: med(a, lambda r: r["summary"]["tokens_per_s"] * r["summary"]["flops_per_token"]) for a in archs}
    mem = {a: med(a, lambda r: r["peak_mem"]) for a in archs}
    ref = "pre_ln" if "pre_ln" in archs else archs[0]
    what = "peak RSS growth" if args.device == "cpu" else "max_memory_allocated"
    print(
        f"\n## archs: relative to {ref} (model={args.model}, norm=rmsnorm, batch {args.batch}, {args.steps} steps, "
        f"compile={str(args.compile).lower()}, median of {args.repeats}, interleaved)"
    )
    print(
        f"| arch | params | FLOPs/token | tokens/s | tokens/s vs {ref} | FLOP/s vs {ref} | MFU | peak mem ({what}) "
        f"| mem vs {ref} | measured / estimate |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    cpu_rows = []
    for a in archs:
        s0 = results[a][0]["summary"]
        mfu = med(a, lambda r: r["summary"].get("mfu"))
        mfu_s = f"{100 * mfu:.1f}%" if mfu else "n/a"
        mem_r = f"{mem[a] / mem[ref]:.2f}" if mem[a] and mem[ref] else "n/a"
        est = results[a][0]["mem_estimate"]
        est_r = f"{mem[a] / est:.2f}" if mem[a] else "n/a"
        print(
            f"| {a} | {s0['n_params']:,} | {s0['flops_per_token'] / 1e6:.2f}M | {tps[a]:,.0f} | "
            f"{tps[a] / tps[ref]:.3f} | {fps[a] / fps[ref]:.3f} | {mfu_s} | {_mb(mem[a])} | {mem_r} | {est_r} |"
        )
        if cpu[a] and cpu[ref]:
            flops_r = results[a][0]["summary"]["flops_per_token"] / results[ref][0]["summary"]["flops_per_token"]
            cpu_rows.append(f"| {a} | {cpu[a]:,.0f} | {cpu[a] / cpu[ref]:.3f} | {flops_r * cpu[a] / cpu[ref]:.3f} |")
    if cpu_rows:
        print("\nSame runs, per CPU-second of the steady-state steps (load-robust with one thread):")
        print(f"| arch | tokens/CPU-s | tokens vs {ref} | FLOPs vs {ref} |\n|---|---:|---:|---:|")
        print("\n".join(cpu_rows))
    if "ngpt" in archs:
        renorm_share(args)


def _compile_s(eager: list[dict], compiled: list[dict], timed: int) -> float:
    """The extra wall time to the compiled steady state: the wall difference plus what the timed steps saved."""
    return statistics.median(
        c["wall_s"] - e["wall_s"] + timed * (e["step_time_s"] - c["step_time_s"]) for e, c in zip(eager, compiled)
    )


def suite_compile(args) -> None:
    """Eager vs compile=true per arch, with a cold and a warm inductor cache.

    Each repeat runs eager, then compiled in a fresh cache directory (cold: the full compile), then
    compiled again in that same directory (warm: what every job of a sweep after the first gets,
    inductor's FX-graph and AOTAutograd caches being on by default). Compile time = the extra wall
    time a compiled run takes to reach its steady state; break-even = compile time / step saving."""
    archs = args.archs
    modes = ("eager", "cold", "warm")
    runs: dict[tuple[str, str], list[dict]] = {(a, m): [] for a in archs for m in modes}
    for _ in range(args.repeats):
        for arch in archs:
            runs[(arch, "eager")].append(isolated([*_common(args, False), f"arch={arch}"], args.steps))
            with tempfile.TemporaryDirectory() as cache:
                env = {"TORCHINDUCTOR_CACHE_DIR": cache}
                for m in ("cold", "warm"):
                    runs[(arch, m)].append(isolated([*_common(args, True), f"arch={arch}"], args.steps, env))
    timed = args.steps - WARMUP
    print(
        f"\n## compile: compile=true vs eager (model={args.model}, norm=rmsnorm, batch {args.batch}, "
        f"{args.steps} steps, {torch.get_num_threads() if args.threads is None else args.threads} thread(s), "
        f"median of {args.repeats}, interleaved)"
    )
    print(
        "| arch | eager tokens/s | compiled tokens/s | speed-up (wall; per CPU-s) | step saving "
        "| compile time cold / warm | break-even steps cold / warm | compiled FLOP/s vs pre_ln "
        "| peak mem compiled / eager |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    med = statistics.median
    fps, rows = {}, []
    for a in archs:
        e, c, w = ([r["summary"] for r in runs[(a, m)]] for m in modes)
        te, tc = med(s["tokens_per_s"] for s in e), med(s["tokens_per_s"] for s in c + w)
        cpu = "n/a"
        if all(s.get("cpu_tokens_per_s") for s in e + c + w):
            cpu = f"{med(s['cpu_tokens_per_s'] for s in c + w) / med(s['cpu_tokens_per_s'] for s in e):.2f}x"
        se, sc = med(s["step_time_s"] for s in e), med(s["step_time_s"] for s in c + w)
        me = med(r["peak_mem"] or 0 for r in runs[(a, "eager")])
        mc = med(r["peak_mem"] or 0 for r in runs[(a, "cold")])
        fps[a] = tc * c[0]["flops_per_token"]
        rows.append((a, te, tc, cpu, se, sc, _compile_s(e, c, timed), _compile_s(e, w, timed), me, mc))
    ref = "pre_ln" if "pre_ln" in fps else archs[0]
    for a, te, tc, cpu, se, sc, cold, warm, me, mc in rows:
        even = " / ".join(f"{t / (se - sc):,.0f}" if se > sc else "never" for t in (cold, warm))
        mem_r = f"{mc / me:.2f}" if me and mc else "n/a"
        print(
            f"| {a} | {te:,.0f} | {tc:,.0f} | {tc / te:.2f}x; {cpu} | {100 * (1 - sc / se):.0f}% | "
            f"{cold:.0f} s / {warm:.0f} s | {even} | {fps[a] / fps[ref]:.3f} | {mem_r} |"
        )


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


def _stepper(cfg, vocab: int, device: torch.device, seed: int):
    """One training step of ``cfg``'s model (forward, backward, clip, optimizer, nGPT's re-normalization)."""
    from normbench.model import build_model
    from normbench.optim.optimizers import build_optimizer

    torch.manual_seed(seed)
    model = build_model(cfg, vocab).to(device)
    opt = build_optimizer(model, cfg, log=lambda *a: None)
    batch = torch.randint(0, vocab, (cfg.trainer.batch_size, cfg.model.seq_len + 1), device=device)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.precision)

    def step() -> None:
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            _, loss = model(batch[:, :-1], batch[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.trainer.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if hasattr(model, "after_step"):
            model.after_step()

    return model, step


def suite_paired(args) -> None:
    """Each arch and pre_ln built in one process and stepped in alternation, ``--rounds`` rounds of
    two steps each (A B B A ...): the ratio is the median of the per-round ratios, so the slow drift
    of a shared or virtual machine cancels, which the one-process-per-run archs suite cannot do
    (there, the medians of a norm-free arch move by ~10% between invocations). Eager or compiled as
    ``--compile`` says; no trainer, data loading, diagnostics or evaluation: the model's own step."""
    from normbench.runtime.flops import model_flops_per_token

    device = torch.device(args.device)
    common = [o for o in _common(args) if not o.startswith("compile=")]
    ref = "pre_ln"
    ref_cfg = compose([*common, f"arch={ref}"])
    vocab = padded_vocab(ref_cfg, load_data(ref_cfg.data, log=lambda *a: None).vocab_size)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def timed(step) -> float:
        sync()
        t0 = time.perf_counter()
        for _ in range(STEPS_PER_ROUND):
            step()
        sync()
        return (time.perf_counter() - t0) / STEPS_PER_ROUND

    print(
        f"\n## paired: each arch against {ref} in one process, alternating (model={args.model}, norm=rmsnorm, "
        f"batch {args.batch}, {args.rounds} rounds x {STEPS_PER_ROUND} steps each, compile={str(args.compile).lower()})"
    )
    print(f"| arch | FLOPs/token | ms/step | tokens/s vs {ref} | quartiles | FLOP/s vs {ref} |")
    print("|---|---:|---:|---:|---:|---:|")
    for arch in [a for a in args.archs if a != ref] or [ref]:
        if args.compile:  # dynamo keeps one cache entry per model instance of GPT.forward and falls back to
            torch._dynamo.reset()  # eager past its recompile limit (8): each pair starts from an empty cache
        cfgs = {ref: ref_cfg, arch: compose([*common, f"arch={arch}"])}
        models, steps = {}, {}
        for name, cfg in cfgs.items():
            models[name], steps[name] = _stepper(cfg, vocab, device, seed=0)
            if args.compile:
                models[name].compile()
        for name in cfgs:
            for _ in range(WARMUP):
                steps[name]()
        ratios, times = [], []
        for r in range(args.rounds):
            order = (ref, arch) if r % 2 == 0 else (arch, ref)
            t = {name: timed(steps[name]) for name in order}
            ratios.append(t[ref] / t[arch])  # tokens/s of arch over ref's
            times.append(t[arch])
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        fpt = {n: model_flops_per_token(models[n], cfgs[n].model) for n in cfgs}
        print(
            f"| {arch} | {fpt[arch] / 1e6:.2f}M | {1e3 * statistics.median(times):.1f} | {q[1]:.3f} "
            f"| {q[0]:.3f}-{q[2]:.3f} | {q[1] * fpt[arch] / fpt[ref]:.3f} |",
            flush=True,
        )
        del models, steps


def suite_diag(args) -> None:
    common = [
        f"model={args.model}",
        "arch=pre_ln",
        "norm=rmsnorm",
        f"trainer.batch_size={args.batch}",
        f"device={args.device}",
        f"precision={args.precision}",
        *args.set,
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
    p.add_argument("--suite", default="baseline,archs,diag", help="comma-separated: baseline,archs,compile,diag,paired")
    p.add_argument(
        "--archs", default=",".join(ARCHS), help="archs, compile and paired suites: comma-separated (default all)"
    )
    p.add_argument("--threads", type=int, default=None, help="torch threads per run (default: torch's)")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # internal: one isolated run (JSON spec)
    p.add_argument("--model", default=None, help="model config (default: small on CPU, gpt2_124m on CUDA)")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rounds", type=int, default=12, help="paired suite: alternating rounds per arch")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--precision", default=None, choices=["fp32", "bf16", "fp16"])
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override for every run of the archs, compile, diag and paired suites (repeatable), "
        "e.g. --set model.d_model=512 --set model.n_head=8",
    )
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
        os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the workers inherit it
    if args.worker:
        print(RESULT + json.dumps(worker(json.loads(args.worker))), flush=True)
        return 0
    args.archs = args.archs.split(",")
    if bad := [a for a in args.archs if a not in ARCHS]:
        p.error(f"unknown arch(s) {', '.join(bad)}; choose from {', '.join(ARCHS)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_throughput: error: --device cuda but no CUDA GPU is available", file=sys.stderr)
        return 2
    gpu = args.device == "cuda"
    args.model = args.model or ("gpt2_124m" if gpu else "small")
    args.batch = args.batch or (16 if gpu else 8)
    args.steps = args.steps or (50 if gpu else 40)
    args.precision = args.precision or ("bf16" if gpu else "fp32")
    if args.steps <= WARMUP:
        p.error(f"--steps {args.steps}: a run's first {WARMUP} steps are untimed; give at least {WARMUP + 2}")
    quiet_logs()
    print(
        f"# normbench throughput, device={args.device} ({torch.cuda.get_device_name() if gpu else 'CPU'}), "
        f"torch {torch.__version__}, threads {torch.get_num_threads()}"
    )
    suites = args.suite.split(",")
    if args.set and "baseline" in suites:
        p.error("--set does not apply to the baseline suite (its plain loop has a fixed shape); drop one of them")
    if args.set:
        print(f"# every run with: {' '.join(args.set)}")
    table = {
        "baseline": suite_baseline,
        "archs": suite_archs,
        "compile": suite_compile,
        "diag": suite_diag,
        "paired": suite_paired,
    }
    if bad := [s for s in suites if s not in table]:
        p.error(f"unknown suite(s) {', '.join(bad)}; choose from {', '.join(table)}")
    for name in suites:
        table[name](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
