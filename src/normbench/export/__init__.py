"""``python -m normbench export RUN_DIR OUT_DIR``: a run as a directory transformers loads offline.

Stock classes where the model is exactly one (stock.py: GPT-2, Llama, Qwen3), otherwise a
self-contained custom class with ``auto_map`` (custom.py, hf_template/). Weights are safetensors;
the tokenizer (tokenizer.py), a ``generation_config.json`` and a model card (card.py) go alongside.
Before anything appears at OUT_DIR the export is loaded back with transformers and its logits are
compared with normbench's own on the same tokens; a mismatch is an error and writes nothing.
target.py stages the files and publishes them (a new OUT_DIR as ``mkdir`` makes one; an existing
empty one keeps its mode and group); any OSError is one line, and nothing half-written stays.
"""

from __future__ import annotations

from pathlib import Path

import torch

from normbench.errors import ConfigError, first_line
from normbench.export.target import check_out_dir, staged

__all__ = ["build_hf_model", "export_run", "load_exported", "max_logit_diff"]

TOLERANCE = 1e-4  # max |logit difference| at export, relative to max(1, max |logit|); fp32


def build_hf_model(model, cfg, vocab_size: int, custom: bool = False):
    """(kind, transformers model with ``model``'s weights); kind is gpt2/llama/qwen3/custom."""
    from normbench.export.custom import (  # deferred (start-up time): hydra, omegaconf
        config_dict,
        shipped_state,
        template_classes,
    )
    from normbench.export.stock import build_stock, stock_kind  # deferred (start-up time): hydra, omegaconf

    config_cls, model_cls = template_classes()
    config = config_cls(**config_dict(model, cfg, vocab_size))  # first: refuses a norm it does not compute
    kind = None if custom else stock_kind(model, cfg)
    if kind is not None:
        return kind, build_stock(kind, model, cfg, vocab_size)
    hf = model_cls(config).float().eval()
    state = shipped_state(model)
    if config.tie_word_embeddings:
        state = {k: v for k, v in state.items() if k != "lm_head.weight"}
    try:
        missing, unexpected = hf.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # a parameter whose shape the template does not know
        raise ConfigError(f"export: the custom class does not fit the model ({first_line(exc)[:200]})") from None
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise ConfigError(
            f"export: the custom class does not fit the model (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    return "custom", hf


def load_exported(path, kind: str | None = None):
    """``AutoModelForCausalLM.from_pretrained(path)``, with remote code only for the custom class."""
    from transformers import AutoModelForCausalLM  # deferred (start-up time): transformers

    if kind is None:
        kind = "custom" if (Path(path) / "modeling_normbench.py").is_file() else "stock"
    return AutoModelForCausalLM.from_pretrained(
        str(path), trust_remote_code=kind == "custom", dtype=torch.float32
    ).eval()


@torch.no_grad()
def max_logit_diff(model, hf, idx: torch.Tensor) -> tuple[float, float]:
    """(max |normbench - transformers| logit difference, max |logit|) on tokens ``idx``."""
    ours = model(idx)[0].float()
    theirs = hf(input_ids=idx).logits.float()
    return float((ours - theirs).abs().max()), float(ours.abs().max())


def _generation_config(vocab_size: int, n_tokens: int):
    from transformers import GenerationConfig  # deferred (start-up time): transformers

    # rows past the tokenizer's vocabulary are padding (model.pad_vocab_to): never generated
    suppress = list(range(n_tokens, vocab_size)) or None
    return GenerationConfig(suppress_tokens=suppress, bos_token_id=None, eos_token_id=None, pad_token_id=None)


def export_run(run_dir, out_dir, custom: bool = False, log=print, warn: bool = True) -> dict:
    """Export the run at ``run_dir`` to ``out_dir``; returns {kind, class, max_abs_diff, out_dir}. ``warn``:
    say on stderr when the run is still training (its ``.lock`` names a live process)."""
    from normbench.export.run import load_run, run_tokenizer  # deferred (start-up time): yaml
    from normbench.export.tokenizer import hf_tokenizer  # deferred (start-up time): numpy

    out_dir = Path(out_dir)
    check_out_dir(out_dir)  # before the checkpoint is read: a wrong OUT_DIR is refused at once
    run = load_run(run_dir, warn=warn)
    kind, hf = build_hf_model(run.model, run.cfg, run.vocab_size, custom=custom)
    tokenizer = hf_tokenizer(run_tokenizer(run.cfg), run.model.seq_len)
    with staged(out_dir) as stage:  # published whole once checked; on any error nothing is left
        diff = _write_checked(stage, run, kind, hf, tokenizer, out_dir)
    log(f"exported {run.path} (step {run.step}) as {type(hf).__name__} to {out_dir} (logits match to {diff:.2e})")
    return {"kind": kind, "class": type(hf).__name__, "max_abs_diff": diff, "out_dir": out_dir}


def _write_checked(stage: Path, run, kind: str, hf, tokenizer, out_dir: Path) -> float:
    """Write the export into ``stage``, load it back and compare logits; the max |difference|."""
    from normbench.export.card import model_card  # deferred (start-up time): hydra, omegaconf
    from normbench.export.custom import write_code  # deferred (start-up time): hydra, omegaconf

    hf.save_pretrained(stage, safe_serialization=True)
    if kind == "custom":
        write_code(stage)
    tokenizer.save_pretrained(stage)
    _generation_config(run.vocab_size, len(tokenizer)).save_pretrained(stage)
    loaded = load_exported(stage, kind)
    T = min(run.model.seq_len, 32)
    idx = torch.randint(0, len(tokenizer), (2, T), generator=torch.Generator().manual_seed(0))
    diff, scale = max_logit_diff(run.model, loaded, idx)
    if not diff <= TOLERANCE * max(1.0, scale):
        raise ConfigError(
            f"export: the exported {type(loaded).__name__} gives logits {diff:.3g} away from normbench's "
            f"(allowed {TOLERANCE * max(1.0, scale):.3g}); nothing written to {out_dir}"
        )
    (stage / "README.md").write_text(model_card(run, kind, type(hf).__name__, len(tokenizer), diff, out_dir.name))
    return diff
