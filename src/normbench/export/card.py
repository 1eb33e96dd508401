"""The model card (README.md) of an export: what was trained, on what, how it ended."""

from __future__ import annotations

from omegaconf import OmegaConf

from normbench.config.arch_traits import arch_traits
from normbench.export.custom import FILES
from normbench.norm.scale_and_batch_norms import BatchNormBT, PowerNorm

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


def _load_lines(path: str, remote: bool) -> str:
    """The card's loading snippet; a custom export passes ``trust_remote_code`` to the tokenizer too (it reads
    ``config.json``'s ``auto_map`` and would otherwise stop at an interactive prompt on a terminal)."""
    trust = ", trust_remote_code=True" if remote else ""
    return (
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        f"model = AutoModelForCausalLM.from_pretrained({path!r}{trust})\n"
        f"tok = AutoTokenizer.from_pretrained({path!r}{trust})\n"
        'ids = tok("In the beginning", return_tensors="pt").input_ids\n'
        "print(tok.decode(model.generate(ids, max_new_tokens=40, do_sample=False)[0]))"
    )


def _data_keys(d) -> dict:
    keys = ["vocab_size"] if d.tokenizer == "bpe" else []
    keys += {"files": ["paths"], "hf": ["hf_path", "hf_config", "hf_split", "hf_text_field"]}.get(d.name, [])
    keys += ["synthetic_tokens"] if d.name == "synthetic" else []
    return {k: d[k] for k in dict.fromkeys(keys) if d.get(k) not in (None, [], "")}


def _code_note(run, remote: bool, hf_class: str) -> str:
    """Which class this is; for the batch-statistic norms, which statistics the export uses and why it matters."""
    code = (
        f"It is a custom class: {', '.join(f'`{name}`' for name in FILES)}\n"
        "in this directory (torch and transformers only), loaded with `trust_remote_code=True`."
        if remote
        else f"It is exactly a stock `{hf_class}`: no remote code."
    )
    kinds = {type(mod) for mod in run.model.modules()}
    if BatchNormBT in kinds:
        code += (
            "\n**BatchNorm leaked the future in training**: its training forward normalised each position with"
            "\nthe mean and variance of the whole batch x time, later positions included, so the training and"
            "\nvalidation losses it logged are not those of a causal model. This export computes BatchNorm's"
            "\nevaluation form (the running statistics saved with the weights), which is causal."
        )
    if PowerNorm in kinds:
        code += "\nPowerNorm is computed with its running quadratic mean, as in normbench's evaluation."
        if run.cfg.norm.pn_warmup:
            code += (
                f" Its first {run.cfg.norm.pn_warmup} training steps (norm.pn_warmup) divided by batch"
                " statistics, which leaked the future."
            )
    return code


def _front_matter(arch: str, norm: str) -> str:
    return (
        f"---\nlibrary_name: transformers\npipeline_tag: text-generation\ntags:\n- normbench\n- {arch}\n- {norm}\n---\n"
    )


def model_card(run, kind: str, hf_class: str, n_tokens: int, max_abs_diff: float, path: str) -> str:
    cfg, s = run.cfg, run.summary
    a, n, m, d = cfg.arch, cfg.norm, cfg.model, cfg.data
    title = f"normbench {a.name} + {'L2 (nGPT)' if arch_traits(a.name).unit_norm_geometry else n.name}"
    load = _load_lines(path, kind == "custom")
    rows = [f"| {label} | {_fmt(s.get(key))} |" for key, label in _SUMMARY_KEYS if key in s]
    data = "".join(f", `data.{k}={v}`" for k, v in _data_keys(d).items())
    padding = (
        f" The embedding has {run.vocab_size} rows; the {run.vocab_size - n_tokens} past the tokenizer's are"
        " padding, never trained, and `generation_config.json` suppresses them."
        if run.vocab_size > n_tokens
        else ""
    )
    code = _code_note(run, kind == "custom", hf_class)
    return f"""{_front_matter(a.name, n.name)}
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

`data={d.name}`{data}, tokenizer `{d.tokenizer}`;
the last {d.val_fraction:.0%} of the text is the validation split, the rest was trained on
({_fmt(run.tokens)} tokens seen in {_fmt(run.step)} steps).

{_config_section(cfg)}"""


def _config_section(cfg) -> str:
    return f"""## Config

The run's resolved config (`.hydra/config.yaml` of its run directory):

```yaml
{OmegaConf.to_yaml(cfg, resolve=True).rstrip()}
```
"""
