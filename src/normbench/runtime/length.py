"""A run's length: optimizer steps from ``trainer.max_steps`` / ``max_tokens``, or from ``trainer.tokens_per_param``.

The normalization papers train their models at or past Chinchilla's compute-optimal ~20 tokens per
parameter (Hoffmann et al. 2022, arXiv:2203.15556); a CPU miniature trained for a fixed 200 steps sees
about 1. ``trainer.tokens_per_param=R`` makes the length a property of the run that carries down with
the size: the run trains ``R x N`` tokens, i.e. ``round(R x N / tokens_per_step)`` steps.

Which N (:func:`length_params`): the model's **weight matrices**, embeddings and an untied head included
(kinds ``matrix``, ``embed``, ``head``, model/kinds.py), without its vectors and scalars (norm gains,
biases, DyT/Derf alpha, nGPT's scales). Chinchilla counts every parameter, embeddings included; the
vectors are a small share of any transformer (0.5% of the 4-block tiny model with LayerNorm, 0.9% with
Peri-LN's extra norms, 0.02% of GPT-2 124M), so N is Chinchilla's count to within that share. Leaving
them out makes N a property of the model's *shape*: two placements or norms of one shape (Peri-LN's
extra output norms, LayerNorm's biases against RMSNorm's none) get the same N and so train the same
tokens, which is what a comparison needs. Kaplan et al. 2020 (arXiv:2001.08361) leave the embeddings out
as well; with a 256-byte vocabulary that would change little here but a third of GPT-2 124M, and "20
tokens per parameter" is Chinchilla's number, so the embeddings stay in.

Hand-written: counting by kind is this project's own declaration (model/kinds.py); the model is built on
the meta device, so it costs no memory and no data.
"""

from __future__ import annotations

import math
from typing import Any

from normbench.errors import ConfigError

COUNTED_KINDS = ("matrix", "embed", "head")


def config_vocab(cfg: Any) -> int:
    """The (padded) vocabulary the run's model is built with, from the config alone (no data loaded)."""
    from normbench.data.tokenizer import config_data_vocab  # deferred (start-up time): numpy
    from normbench.model import padded_vocab  # deferred (start-up time): torch, hydra, omegaconf

    return padded_vocab(cfg, config_data_vocab(cfg.data))


def length_params(cfg: Any, vocab: int | None = None) -> int:
    """N of ``trainer.tokens_per_param``: the weight-matrix parameters (embeddings and head included)."""
    import torch  # deferred (start-up time): torch

    from normbench.model import build_model  # deferred (start-up time): torch, hydra, omegaconf

    with torch.device("meta"):
        model = build_model(cfg, vocab or config_vocab(cfg))
    return count_matrices(model)


def count_matrices(model) -> int:
    """The parameters of ``model`` that :func:`length_params` counts (a tied tensor once)."""
    from normbench.model.kinds import param_kinds  # deferred (start-up time): torch, hydra, omegaconf

    params = dict(model.named_parameters())
    return sum(params[name].numel() for name, kind in param_kinds(model).items() if kind in COUNTED_KINDS)


def tokens_per_step(cfg: Any) -> int:
    t = cfg.trainer
    return t.batch_size * t.grad_accum * cfg.model.seq_len


def run_steps(cfg: Any, vocab: int | None = None, n: int | None = None) -> int:
    """Optimizer steps the run takes: from ``trainer.tokens_per_param`` when set (``n``: its N, if known),
    else ``trainer.max_steps`` (or fewer, when ``trainer.max_tokens`` comes first)."""
    t = cfg.trainer
    ratio = getattr(t, "tokens_per_param", None)
    if ratio is None:
        if not t.max_tokens:
            return t.max_steps
        return min(t.max_steps, max(1, t.max_tokens // tokens_per_step(cfg)))
    if t.max_tokens:
        raise ConfigError(
            f"trainer.tokens_per_param={ratio} and trainer.max_tokens={t.max_tokens} both set the run's length; "
            "set one of them (trainer.max_tokens=null)"
        )
    return max(1, round(ratio * (n or length_params(cfg, vocab)) / tokens_per_step(cfg)))


def describe(cfg: Any, steps: int, n: int | None = None) -> str:
    """The start-up line: the length in steps, tokens and tokens per (weight-matrix) parameter."""
    n = n or length_params(cfg)
    tokens = steps * tokens_per_step(cfg)
    ratio = getattr(cfg.trainer, "tokens_per_param", None)
    if ratio is not None:
        source = f"from trainer.tokens_per_param={ratio:g}, not trainer.max_steps={cfg.trainer.max_steps}"
    elif steps < cfg.trainer.max_steps:
        source = f"from trainer.max_tokens={cfg.trainer.max_tokens}"
    else:
        source = "from trainer.max_steps"
    return (
        f"length: {steps:,} steps x {tokens_per_step(cfg):,} tokens = {tokens:,} tokens = "
        f"{tokens / n:.3g} tokens per parameter ({n:,} weight-matrix params; {source})"
    )


def check_ratio(ratio: float | None) -> None:
    if ratio is not None and not (isinstance(ratio, int | float) and math.isfinite(ratio) and ratio > 0):
        raise ConfigError(f"trainer.tokens_per_param={ratio} must be a positive number (e.g. 20, Chinchilla's)")


# Muennighoff et al. 2023, "Scaling Data-Constrained Language Models" (arXiv:2305.16264): up to about 4
# epochs of repeated data cost almost nothing against fresh data; beyond, returns fall off fast.
MAX_PASSES = 4


def passes(tokens: int, corpus_tokens: int) -> tuple[float, str | None]:
    """(passes over the training split that ``tokens`` make, a warning past :data:`MAX_PASSES`)."""
    n = tokens / max(corpus_tokens, 1)
    if n <= MAX_PASSES:
        return n, None
    return n, (
        f"the run passes {n:,.1f} times over the corpus' {corpus_tokens:,} training tokens: past {MAX_PASSES}, "
        "repeated tokens are worth much less than fresh ones (Muennighoff et al. 2023); a larger corpus: "
        "python -m normbench prepare (README, Data)"
    )
