"""``eval.json``: a run's downstream scores, as ``normbench eval`` writes them and the report reads them.

    {"harness": "lm-eval", "harness_version": "0.4.13", "checkpoint_step": 200,
     "tasks": {"arc_easy": {"metrics": {"acc": {"value": 0.41, "stderr": 0.01}, "acc_norm": {...}},
                            "higher_is_better": {"acc": true, "acc_norm": true},
                            "n": 2376, "limit": null, "version": 1.0, "config_hash": "9f2c...",
                            "num_fewshot": 0, "batch_size": 32, "device": "cuda", "precision": "bf16"}}}

A metric's name is the harness's (``acc``), with its filter after a comma where the filter is not ``none``
(``exact_match,flexible-extract``); ``stderr`` is null where the harness gives none. ``config_hash`` is the
sha256 of the task's resolved config (the harness's ``configs`` entry, JSON with sorted keys): two scores
of a task compare only when their hashes agree. A later ``eval`` of the same checkpoint with the same
harness version adds its tasks to the file (a task scored again is replaced); another checkpoint or
harness version starts the file afresh. The file is replaced atomically.

Elsewhere a downstream metric is named ``TASK/METRIC`` (``arc_easy/acc_norm``): the report's ``--metric`` and a
claim test's ``metric`` (:func:`split_metric`, :func:`downstream_value`).
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

from normbench.run.metrics import write_json_atomic
from normbench.run.reader import RunReader

HARNESS = "lm-eval"
LOWER_IS_BETTER = ("perplexity", "bits_per_byte", "loss", "ter")  # by name, where eval.json does not say


def config_hash(config) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()


def _number(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def metrics_of(entry: dict) -> dict:
    """One task's metrics from the harness's ``results`` entry: {name: {value, stderr}}."""
    out = {}
    for key, value in entry.items():
        metric, _, filt = key.partition(",")
        if metric.endswith("_stderr") or _number(value) is None or not filt:
            continue  # the alias, a sample count, a stderr (read with its metric below)
        name = metric if filt == "none" else key
        out[name] = {"value": _number(value), "stderr": _number(entry.get(f"{metric}_stderr,{filt}"))}
    return out


def task_records(out: dict, extra: dict) -> dict:
    """{task: record} from ``simple_evaluate``'s result ``out`` (groups too); ``extra`` goes into each."""
    records = {}
    for task, entry in out["results"].items():
        config = out.get("configs", {}).get(task)
        n = out.get("n-samples", {}).get(task, {}).get("effective")
        metrics = metrics_of(entry)
        higher = out.get("higher_is_better", {}).get(task, {})
        records[task] = {
            "metrics": metrics,
            "higher_is_better": {m: bool(higher[m.split(",")[0]]) for m in metrics if m.split(",")[0] in higher},
            "n": n,
            "version": out.get("versions", {}).get(task),
            "config_hash": config_hash(config) if config is not None else None,
            "num_fewshot": out.get("n-shot", {}).get(task),
            **extra,
        }
    return records


def write_eval(run_dir: Path, version: str, step: int, tasks: dict) -> dict:
    """Merge ``tasks`` into the run's ``eval.json`` (module docstring) and write it atomically; the file's data."""
    reader = RunReader(run_dir)
    old = reader.downstream() or {}
    keep = old.get("harness_version") == version and old.get("checkpoint_step") == step
    data = {
        "harness": HARNESS,
        "harness_version": version,
        "checkpoint_step": step,
        "tasks": {**((old.get("tasks") or {}) if keep else {}), **tasks},
    }
    write_json_atomic(data, reader.dir.eval_path)
    return data


def split_metric(text: str) -> tuple[str, str] | None:
    """``arc_easy/acc_norm`` -> (``arc_easy``, ``acc_norm``); None for a name without one ``/`` between two words."""
    task, sep, metric = str(text).partition("/")
    return (task, metric) if sep and task.strip() and metric.strip() and "/" not in metric else None


def higher_is_better(datas, task: str, metric: str) -> bool:
    """Whether a larger ``metric`` of ``task`` is better: as the first ``eval.json`` data of ``datas`` that says
    (the harness's own flag), else by the name (perplexities, bits per byte and losses are lower-better)."""
    for data in datas:
        try:
            return bool(data["tasks"][task]["higher_is_better"][metric])
        except (KeyError, TypeError):
            continue
    return not any(word in metric.split(",")[0] for word in LOWER_IS_BETTER)


def downstream_value(data: dict | None, task: str, metric: str) -> float | None:
    """``tasks[task].metrics[metric].value`` of an ``eval.json``'s data; None where it has none."""
    try:
        return _number(data["tasks"][task]["metrics"][metric]["value"])
    except (KeyError, TypeError):
        return None
