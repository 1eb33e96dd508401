"""``python -m normbench sample RUN_DIR --prompt ...``: text from a run's last checkpoint.

normbench's own model decodes with its KV cache (``model(idx, cache=KVCache)``: the prompt in
one forward, then one token per forward). ``--hf`` exports the run to a temporary directory and
decodes with transformers' ``generate`` instead; greedy decoding (``--temperature 0``) gives the
same tokens both ways. Sampling follows nanoGPT's sample.py (temperature, then top-k, then a
draw); rows of the embedding past the tokenizer's vocabulary (padding) are never produced.
"""

from __future__ import annotations

import argparse
import sys
import tempfile

import torch

from normbench.errors import ConfigError, Parser, error
from normbench.model.attention import KVCache


def _check_length(n_prompt: int, max_new_tokens: int, seq_len: int) -> None:
    if n_prompt == 0:
        raise ConfigError("--prompt is empty after tokenization; give at least one character")
    if max_new_tokens < 0:
        raise ConfigError(f"--max-new-tokens={max_new_tokens} must be >= 0")
    if n_prompt + max_new_tokens > seq_len:
        raise ConfigError(
            f"the prompt ({n_prompt} tokens) plus --max-new-tokens={max_new_tokens} exceeds the "
            f"model's context of {seq_len} tokens (model.seq_len); shorten one of them"
        )


def _check_sampling(temperature: float, top_k: int | None) -> None:
    if not temperature >= 0:
        raise ConfigError(f"--temperature={temperature} must be >= 0 (0 is greedy)")
    if top_k is not None and top_k < 1:
        raise ConfigError(f"--top-k={top_k} must be >= 1")


@torch.no_grad()
def generate(
    model,
    prompt_ids: list[int],
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    seed: int = 0,
    n_tokens: int | None = None,
) -> list[int]:
    """New token ids after ``prompt_ids``; greedy when ``temperature == 0``. ``n_tokens``: ids at or
    above it (the padded embedding rows) are never generated."""
    _check_sampling(temperature, top_k)
    _check_length(len(prompt_ids), max_new_tokens, model.seq_len)
    gen = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    cache = KVCache(len(model.blocks))
    idx = torch.tensor([prompt_ids], dtype=torch.long, device=device)
    out: list[int] = []
    for _ in range(max_new_tokens):
        logits = model(idx, cache=cache)[0][0, -1].float()
        if n_tokens is not None and n_tokens < logits.numel():
            logits[n_tokens:] = -float("inf")
        if temperature == 0:
            nxt = int(torch.argmax(logits))
        else:
            logits = logits / temperature
            if top_k is not None and top_k < logits.numel():
                kth = torch.topk(logits, top_k).values[-1]
                logits[logits < kth] = -float("inf")
            nxt = int(torch.multinomial(torch.softmax(logits, -1).cpu(), 1, generator=gen))
        out.append(nxt)
        idx = torch.tensor([[nxt]], dtype=torch.long, device=device)
    return out


def generate_hf(
    hf, prompt_ids: list[int], max_new_tokens: int, temperature: float, top_k: int | None, seed: int, seq_len: int
) -> list[int]:
    """The same through transformers' ``generate`` (the export's generation_config suppresses padding ids)."""
    _check_sampling(temperature, top_k)
    _check_length(len(prompt_ids), max_new_tokens, seq_len)
    torch.manual_seed(seed)
    idx = torch.tensor([prompt_ids], dtype=torch.long)
    kwargs = {"do_sample": False} if temperature == 0 else {"do_sample": True, "temperature": temperature}
    if temperature:
        kwargs["top_k"] = top_k or 0  # 0: no top-k (transformers' own default is 50)
    out = hf.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=max_new_tokens, **kwargs)
    return out[0, len(prompt_ids) :].tolist()


def parse(argv: list[str]) -> argparse.Namespace:
    p = Parser(prog="python -m normbench sample", description="Generate text from a run's checkpoint.")
    p.add_argument("run_dir", help="a run directory (with checkpoints/last.pt)")
    p.add_argument("--prompt", required=True, help="text to continue")
    p.add_argument("--max-new-tokens", type=int, default=None, help="default: 64, or what the context leaves")
    p.add_argument("--temperature", type=float, default=1.0, help="0: greedy (default 1.0)")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hf", action="store_true", help="decode with the transformers export's generate()")
    p.add_argument("--ids", action="store_true", help="print the generated token ids instead of text")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    from normbench.export.run import load_run, run_tokenizer  # deferred (start-up time): yaml

    try:
        args = parse(argv)
        run = load_run(args.run_dir)
        tok = run_tokenizer(run.cfg)
        ids = tok.encode(args.prompt)
        if args.max_new_tokens is None:
            args.max_new_tokens = max(0, min(64, run.model.seq_len - len(ids)))
        n_tokens = min(tok.vocab_size, run.vocab_size)
        if getattr(tok, "learned_size", None):  # a BPE that learned fewer merges than asked
            n_tokens = min(n_tokens, tok.learned_size)
        if args.hf:
            from normbench.export import export_run, load_exported  # its failure is handled here

            with tempfile.TemporaryDirectory(prefix="normbench-sample-") as tmp:
                export_run(args.run_dir, f"{tmp}/model", log=lambda *_: None, warn=False)  # load_run warned
                hf = load_exported(f"{tmp}/model")
                new = generate_hf(
                    hf, ids, args.max_new_tokens, args.temperature, args.top_k, args.seed, run.model.seq_len
                )
        else:
            new = generate(run.model, ids, args.max_new_tokens, args.temperature, args.top_k, args.seed, n_tokens)
    except ConfigError as exc:
        return error(str(exc))
    print(" ".join(map(str, new)) if args.ids else args.prompt + tok.decode(new))
    sys.stdout.flush()
    return 0
