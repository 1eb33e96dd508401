"""The model card (README.md) of an export: what was trained, on what, how it ended."""

from __future__ import annotations

from omegaconf import OmegaConf

_SUMMARY_KEYS = (
    ("status", "status"),
    ("outcome", "outcome"),
    ("reason", "reason"),
    ("step", "steps"),
    ("tokens", "tokens seen"),
    ("final_loss", "final train loss"),
    ("final_val_loss", "final val loss"),
    ("best_val_loss", "best val loss"),
    ("spikes", "loss spikes"),
    ("n_params", "parameters"),
    ("precision", "precision"),
    ("device", "device"),
    ("wall_s", "wall time (s)"),
)


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 1e5 else f"{value:.4g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return "-" if value is None else str(value)


def model_card(run, kind: str, hf_class: str, n_tokens: int, max_abs_diff: float, path: str) -> str:
    cfg, s = run.cfg, run.summary
    a, n, m, d = cfg.arch, cfg.norm, cfg.model, cfg.data
    remote = kind == "custom"
    title = f"normbench {a.name} + {n.name if a.name != 'ngpt' else 'L2 (nGPT)'}"
    load = (
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        f"model = AutoModelForCausalLM.from_pretrained({path!r}{', trust_remote_code=True' if remote else ''})\n"
        f"tok = AutoTokenizer.from_pretrained({path!r})\n"
        'ids = tok("In the beginning", return_tensors="pt").input_ids\n'
        "print(tok.decode(model.generate(ids, max_new_tokens=40, do_sample=False)[0]))"
    )
    rows = [f"| {label} | {_fmt(s.get(key))} |" for key, label in _SUMMARY_KEYS if key in s]
    keys = ["vocab_size"] if d.tokenizer == "bpe" else []
    keys += {"files": ["paths"], "hf": ["hf_path", "hf_config", "hf_split", "hf_text_field"]}.get(d.name, [])
    keys += ["synthetic_tokens"] if d.name == "synthetic" else []
    data = {k: d[k] for k in dict.fromkeys(keys) if d.get(k) not in (None, [], "")}
    full = OmegaConf.to_yaml(cfg, resolve=True)
    padding = (
        f" The embedding has {run.vocab_size} rows; the {run.vocab_size - n_tokens} past the tokenizer's are"
        " padding, never trained, and `generation_config.json` suppresses them."
        if run.vocab_size > n_tokens
        else ""
    )
    code = (
        "It is a custom class: `modeling_normbench.py` and `configuration_normbench.py` in this\n"
        "directory (torch and transformers only), loaded with `trust_remote_code=True`."
        if remote
        else f"It is exactly a stock `{hf_class}`: no remote code."
    )
    return f"""---
library_name: transformers
pipeline_tag: text-generation
tags:
- normbench
- {a.name}
- {n.name}
---

# {title}

A {m.n_layer}-layer, d_model {m.d_model} causal language model trained with
normbench (normalization ablations for GPT-style pretraining):
placement `arch={a.name}`, norm `norm={n.name}`, model preset `model={m.name}`, seed {cfg.seed}.
{code}
At export, its logits matched normbench's own model on the same tokens to {max_abs_diff:.2e}
(max absolute difference, fp32).

## Use

```python
{load}
```

Tokenizer: `{d.tokenizer}` ({n_tokens} tokens), saved here for `AutoTokenizer`.{padding}
No end-of-text token was trained: generation stops at `max_new_tokens`. Context: {run.model.seq_len} tokens.

## Outcome

| | |
|---|---|
{chr(10).join(rows)}

## Data

`data={d.name}`{"".join(f", `data.{k}={v}`" for k, v in data.items())}, tokenizer `{d.tokenizer}`;
the last {d.val_fraction:.0%} of the text is the validation split, the rest was trained on
({_fmt(run.tokens)} tokens seen in {_fmt(run.step)} steps).

## Config

The run's resolved config (`.hydra/config.yaml` of its run directory):

```yaml
{full.rstrip()}
```
"""
