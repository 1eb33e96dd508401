"""The report's setup box: what the compared runs held fixed, resolved from each run's files.

Each line is read per run (``.hydra/config.yaml`` for the settings, ``summary.json`` for what the
run resolved and measured: parameters, tokens, tokens per parameter, steps, init std, per-kind LRs, device,
commit)
and shown once when every run agrees; a line that differs between runs says so and lists the values
(a range for numbers). Nothing is recomputed that the run recorded: tokens per parameter is summary.json's
``tokens_per_param`` (tokens over the weight-matrix parameters, runtime/length.py), not ``tokens / n_params``.
What a null or ``auto`` setting means is resolved as the trainer resolves it: warmup null is 10% of the
run's steps, ``model.init_std: auto`` is GPT-2's gain at the run's width.
"""

from __future__ import annotations

from collections.abc import Callable

from normbench.analysis.loading import Group, Run, setting
from normbench.config.recipes import recipe_values
from normbench.config.schema import init_std_of
from normbench.data.tokenizer import DEFAULT_BPE_VOCAB, fixed_vocab
from normbench.diag.outcomes import finite

DASH = "—"


def _num(run: Run, key: str):
    v = (run.summary or {}).get(key)
    return v if finite(v) else None


def _model(r: Run) -> str | None:
    name = setting(r, "model")
    if name is None:
        return None
    parts = [
        f"{setting(r, 'model.n_layer')} blocks",
        f"d_model {setting(r, 'model.d_model')}",
        f"{setting(r, 'model.n_head')} heads",
        f"seq {setting(r, 'model.seq_len')}",
    ]
    extra = [x for x in (setting(r, "model.mlp"), setting(r, "model.pos")) if x]
    return f"{name} ({', '.join(p for p in parts if 'None' not in p)}{', ' if extra else ''}{', '.join(extra)})"


def _tokens(r: Run) -> str | None:
    tokens = _num(r, "tokens")
    if tokens is None:
        return None
    batch, seq = setting(r, "trainer.batch_size"), setting(r, "model.seq_len")
    accum = setting(r, "trainer.grad_accum") or "1"
    per = f" ({int(batch) * int(seq) * int(accum):,} per step)" if batch and seq and batch.isdigit() else ""
    return f"{int(tokens):,}{per}"


def _tokens_per_param(r: Run) -> str | None:
    ratio = _num(r, "tokens_per_param")
    return f"{ratio:.4g}" if ratio is not None else None


def _forced(r: Run, key: str):
    """The value the run's arch forces for ``key`` whatever the config said (nGPT: no warmup, no decay)."""

    return recipe_values(setting(r, "arch")).get(key)


def _optim(r: Run) -> str | None:
    name = setting(r, "optim")
    if name is None:
        return None
    wd = _forced(r, "optim.weight_decay")
    wd = f"{wd:g} ({setting(r, 'arch')}'s recipe)" if wd is not None else setting(r, "optim.weight_decay")
    betas = (setting(r, "optim.betas") or "").strip("[]()") or None
    bits = [f"lr {setting(r, 'optim.lr')}", f"weight decay {wd}"]
    if name in ("adamw", "lion"):
        bits += [f"betas ({betas})"] + ([f"eps {setting(r, 'optim.eps')}"] if name == "adamw" else [])
    elif name == "muon":
        bits += [
            f"momentum {setting(r, 'optim.momentum')}",
            f"AdamW side: lr {setting(r, 'optim.adamw_lr') or 'lr'}, betas ({betas}), eps {setting(r, 'optim.eps')}",
        ]
    elif name == "sgd":
        bits.append(f"momentum {setting(r, 'optim.momentum')}")
    return f"{name}, " + ", ".join(b for b in bits if "None" not in b and "()" not in b)


def _decay(r: Run) -> str | None:
    """Which parameter kinds weight decay skips (optim.decay_*; optim/optimizers.py's policy)."""
    kinds = (
        ("norm_in", "input-norm gains"),
        ("norm_out", "output-norm gains"),
        ("bias", "biases"),
        ("embed", "embeddings"),
        ("scalars", "scalars"),
    )
    flags = {k: setting(r, f"optim.decay_{k}") for k, _ in kinds}
    if any(v is None for v in flags.values()):
        return None
    if _forced(r, "optim.weight_decay") == 0 or setting(r, "optim.weight_decay") in ("0", "0.0"):
        return "nothing is decayed (weight decay 0)"
    skipped = [what for k, what in kinds if flags[k] != "true"]
    decayed = [what for k, what in kinds if flags[k] == "true"]
    return (
        "hidden matrices and an untied head decayed"
        + (f", also {', '.join(decayed)}" if decayed else "")
        + (f"; not decayed: {', '.join(skipped)}" if skipped else "")
    )


def _lr(r: Run) -> str | None:
    """The peak LR per parameter kind the run resolved (summary's ``lr_resolved``), one number when all share it."""
    kinds, source = (r.summary or {}).get("lr_resolved"), (r.summary or {}).get("lr_source")
    if not kinds:
        return None
    shown = {k: "/".join(f"{x:.4g}" for x in v) if isinstance(v, list) else f"{v:.4g}" for k, v in kinds.items()}
    one = len(set(shown.values())) == 1
    text = next(iter(shown.values())) if one else ", ".join(f"{k} {v}" for k, v in shown.items())
    return text + (f" ({source})" if source else "")


def _sched(r: Run) -> str | None:
    """The schedule with its warmup resolved: null is 10% of the run's steps (train/optim.warmup_steps)."""
    name = setting(r, "sched")
    if name is None:
        return None
    warm, forced = setting(r, "sched.warmup_steps"), _forced(r, "sched.warmup_steps")
    steps = _num(r, "max_steps") or _int(setting(r, "trainer.max_steps"))
    if forced is not None:
        warm = f"{forced} steps ({setting(r, 'arch')}'s recipe)"
    elif warm is not None:
        warm = f"{warm} steps"
    else:
        warm = f"{int(0.1 * steps)} steps (null: 10% of {int(steps)})" if steps else "10% of the run (null)"
    extra = f", decay over the last {setting(r, 'sched.decay_fraction')} of the run" if name == "wsd" else ""
    return f"{name}, warmup {warm}, min lr ratio {setting(r, 'sched.min_lr_ratio')}{extra}"


def _int(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


INIT_MEANS = {"auto": "0.02 x sqrt(768 / d_model), GPT-2's gain at this width", "fan_in": "d_model^-0.5"}


def _init(r: Run) -> str | None:
    """The std the run recorded, with what ``model.init_std`` says (``auto``: GPT-2's gain at this width) and
    whether the arch's own rule replaced it."""

    std, given, d = _num(r, "init_std"), setting(r, "model.init_std"), _int(setting(r, "model.d_model"))
    if std is None:
        return given
    text = f"std {std:.4g}"
    if given is not None:
        means = INIT_MEANS.get(given, "given")
        try:
            own = d is not None and abs(init_std_of(given, d) - std) > 1e-3 * std  # a rounded record still matches
        except ValueError:
            own = False
        text += f" (model.init_std={given}: {means}" + ("; the arch's own rule replaced it" if own else "") + ")"
    return text


def _scaled(r: Run) -> str | None:
    """GPT-2's scaled init of the output projections (``arch.scaled_init``; some archs turn it off)."""
    scaled = setting(r, "arch.scaled_init")
    return None if scaled is None else ("std / sqrt(2 x n_layer)" if scaled == "true" else "the init's std")


def _embeddings(r: Run) -> str | None:
    tied = setting(r, "model.tie_embeddings")
    return None if tied is None else ("tied (the head is the embedding)" if tied == "true" else "untied")


def _vocab(r: Run) -> str | None:
    """The embedding rows the model was built with: the tokenizer's vocabulary (or model.vocab_size), padded
    to a multiple of model.pad_vocab_to (normbench.model.padded_vocab)."""

    tok, pad = setting(r, "data.tokenizer"), _int(setting(r, "model.pad_vocab_to"))
    if tok is None or pad is None:
        return None
    data = fixed_vocab(tok, setting(r, "data.name") or "kjv") or _int(setting(r, "data.vocab_size"))
    if data is None and str(tok).startswith(("tiktoken:", "hf:")):
        return f"{tok}'s"  # known once the tokenizer is loaded; the report does not load it
    data = data or DEFAULT_BPE_VOCAB
    vocab = _int(setting(r, "model.vocab_size")) or data
    rows = pad * -(-vocab // pad)
    return f"{data:,} ({tok})" + (f", {rows:,} embedding rows (padded to a multiple of {pad})" if rows != data else "")


def _validation(r: Run) -> str | None:
    frac, batches = setting(r, "data.val_fraction"), setting(r, "trainer.eval_batches")
    if frac is None or batches is None:
        return None
    return f"last {float(frac):.0%} of the corpus held out; {batches} batches per evaluation"


def _grad_clip(r: Run) -> str | None:
    clip = setting(r, "trainer.grad_clip")
    return None if clip is None else ("off" if float(clip) == 0 else f"global norm {clip}")


def _data(r: Run) -> str | None:
    name = setting(r, "data")
    return None if name is None else f"{name}, tokenizer {setting(r, 'data.tokenizer') or '?'}"


def _steps(r: Run) -> str | None:
    steps = setting(r, "trainer.max_steps") or (str(_num(r, "max_steps")) if _num(r, "max_steps") else None)
    if steps is None:
        return None
    batch = setting(r, "trainer.batch_size")
    every = setting(r, "trainer.eval_every")
    return f"{steps}" + (f", batch {batch}" if batch else "") + (f", eval every {every}" if every else "")


def _summary(key: str) -> Callable[[Run], str | None]:
    return lambda r: None if (r.summary or {}).get(key) in (None, "") else str(r.summary[key])


def _precision(r: Run) -> str | None:
    name = setting(r, "precision") or _summary("precision")(r)
    attn = setting(r, "attn_fp32")
    attn = (r.summary or {}).get("attn_fp32") if attn is None else str(attn).lower() == "true"
    return f"{name}, attention kernel in fp32" if name and name != "fp32" and attn else name


def _mode(r: Run) -> str | None:
    compiled = (r.summary or {}).get("compiled")
    return None if compiled is None else ("compiled (torch.compile)" if compiled else "eager")


LINES: tuple[tuple[str, Callable[[Run], str | None]], ...] = (
    ("model", _model),
    ("parameters", lambda r: f"{int(p):,}" if (p := _num(r, "n_params")) else None),
    ("tokens trained", _tokens),
    ("tokens per parameter", _tokens_per_param),
    ("steps", _steps),
    ("optimizer", _optim),
    ("peak LR", _lr),
    ("weight decay", _decay),
    ("grad clip", _grad_clip),
    ("LR schedule", _sched),
    ("init", _init),
    ("output projections' init", _scaled),
    ("embeddings", _embeddings),
    ("data", _data),
    ("vocab", _vocab),
    ("validation", _validation),
    ("precision", _precision),
    ("mode", _mode),
    ("device", _summary("device")),
    ("commit", _summary("commit")),
)


def _as_number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def _shown(values: list[str]) -> str:
    distinct = list(dict.fromkeys(values))
    if len(distinct) == 1:
        return distinct[0]
    nums = [_as_number(v) for v in distinct]
    if all(n is not None for n in nums):  # e.g. parameters: LayerNorm's biases; a range says it best
        lo, hi = distinct[nums.index(min(nums))], distinct[nums.index(max(nums))]
        return f"{lo} to {hi} (differs between groups)"
    listed = "; ".join(distinct[:3]) + (f"; ... ({len(distinct)} values)" if len(distinct) > 3 else "")
    return f"differs: {listed}"


def setup_rows(groups: list[Group]) -> list[list[str]]:
    """[[what, value]]: the varied factors and seeds first, then every line of :data:`LINES`."""
    runs = [r for g in groups for r in g.runs]
    keys = list(groups[0].settings) if groups else []
    varied = "; ".join(f"{k} ({', '.join(dict.fromkeys(g.settings[k] for g in groups))})" for k in keys)
    seeds = sorted({s for r in runs if (s := setting(r, "seed")) is not None}, key=lambda s: float(s))
    rows = [
        ["varied", varied or "nothing (one group)"],
        ["runs", f"{len(runs)} in {len(groups)} groups"],
        ["seeds", ", ".join(seeds) or DASH],
    ]
    for what, fn in LINES:
        values = [v for r in runs if (v := fn(r)) is not None]
        if what == "commit" and not values:
            rows.append([what, "not recorded by these runs"])
        elif values:
            missing = len(runs) - len(values)
            rows.append([what, _shown(values) + (f" ({missing} runs: not recorded)" if missing else "")])
    return rows
