"""The report's setup box: what the compared runs held fixed, resolved from each run's files.

Each line is read per run (``.hydra/config.yaml`` for the settings, ``summary.json`` for what the
run resolved and measured: parameters, tokens, init std, per-kind LRs, device, commit) and shown once when every
run agrees; a line that differs between runs says so and lists the values. Tokens per parameter is
``tokens / n_params`` from summary.json, so runs from before ``tokens_per_param`` existed get it too.
"""

from __future__ import annotations

from collections.abc import Callable

from normbench.diag.outcomes import finite
from normbench.report.loading import Group, Run, setting

DASH = "—"


def _num(run: Run, key: str):
    v = (run.summary or {}).get(key)
    return v if finite(v) else None


def _model(r: Run) -> str | None:
    name = setting(r, "model")
    if name is None:
        return None
    parts = [f"{setting(r, 'model.n_layer')} blocks", f"d_model {setting(r, 'model.d_model')}",
             f"{setting(r, 'model.n_head')} heads", f"seq {setting(r, 'model.seq_len')}"]  # fmt: skip
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
    tokens, params = _num(r, "tokens"), _num(r, "n_params")
    return f"{tokens / params:.3g}" if tokens is not None and params else None


def _optim(r: Run) -> str | None:
    name = setting(r, "optim")
    if name is None:
        return None
    bits = [f"lr {setting(r, 'optim.lr')}", f"weight decay {setting(r, 'optim.weight_decay')}"]
    return f"{name}, " + ", ".join(b for b in bits if not b.endswith("None"))


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
    name = setting(r, "sched")
    if name is None:
        return None
    warm = setting(r, "sched.warmup_steps")
    warm = f"{warm} steps" if warm is not None else "auto"
    return f"{name}, warmup {warm}, min lr ratio {setting(r, 'sched.min_lr_ratio')}"


def _init(r: Run) -> str | None:
    std = _num(r, "init_std")
    given = setting(r, "model.init_std")
    if std is None and given is None:
        return None
    return f"std {std:.4g}" + (f" (model.init_std={given})" if given is not None else "") if std is not None else given


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
    ("LR schedule", _sched),
    ("init", _init),
    ("data", _data),
    ("precision", lambda r: setting(r, "precision") or _summary("precision")(r)),
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
    rows = [["varied", varied or "nothing (one group)"],
            ["runs", f"{len(runs)} in {len(groups)} groups"], ["seeds", ", ".join(seeds) or DASH]]  # fmt: skip
    for what, fn in LINES:
        values = [v for r in runs if (v := fn(r)) is not None]
        if what == "commit" and not values:
            rows.append([what, "not recorded by these runs"])
        elif values:
            missing = len(runs) - len(values)
            rows.append([what, _shown(values) + (f" ({missing} runs: not recorded)" if missing else "")])
    return rows
