"""What a run's numbers mean: its outcome and its per-layer summary statistics.

``status`` says how the process ended (completed, diverged, failed, interrupted);
the **outcome** says what training achieved, for runs that ended on their own:

- ``diverged``: the trainer stopped it (non-finite loss, or loss above
  ``trainer.diverge_factor`` x its first loss);
- ``stuck``: completed, but its best val loss never beat the no-context baseline by
  :data:`STUCK_MARGIN` nats. The baseline is the unigram entropy of the validation
  split, the loss of the best predictor that ignores context (:func:`baseline_loss`);
- ``unstable``: learned, but had loss spikes (``n_spikes`` > 0; a spike is a train
  loss above ``diag.spike_factor`` x the median of the last ``diag.spike_window``
  losses, :class:`normbench.diag.diagnostics.SpikeDetector`);
- ``learned``: everything else that completed.

Failed, interrupted and running runs have no outcome (``None``).

The per-layer statistics (:func:`layer_stats`) condense the diagnostic records the
papers argue with into scalars a dashboard can chart: variance growth across depth
(Peri-LN, Kim et al. 2025, arXiv:2502.02732, Fig. 1), gradient spread across layers
(Xiong et al. 2020, arXiv:2002.04745: Post-LN's gradients grow towards the output),
massive activations (Sun et al. 2024, arXiv:2402.17762) and the output logit scale.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import tempfile
from pathlib import Path

import numpy as np

OUTCOMES = ("learned", "unstable", "stuck", "diverged")
# A run must beat the unigram entropy by 0.1 nats to count as learned: exp(-0.1) = 0.905, i.e. a
# 10% lower perplexity than the best context-free predictor. On the built-in corpus (bytes) that is
# ~10x the standard error of a val loss over the default 8 x 16 x 128 eval tokens (per-token std
# 1.03 nats -> 0.008) and 10x the train/val unigram mismatch (0.01), so noise cannot make a
# no-context model look "learned"; and it is far below what real context use gives (a bigram model
# alone: 2.26 nats, 0.74 under the unigram entropy of 3.00).
STUCK_MARGIN = 0.1
# max|h| / median|h| of one residual-stream layer. On the diagnostic batch a Gaussian stream gives
# ~6 (max of ~1e5 normal samples is ~4.4 sigma, median |x| is 0.67 sigma); Sun et al. call activations
# ~1000x the median "massive" in 7B models. 100 (~15x the Gaussian level) marks the onset in small models.
MASSIVE_THRESHOLD = 100.0
MAX_SPIKE_STEPS = 1000  # summary.json keeps the first 1000 spike steps (n_spikes counts them all)
BASELINE_FILE = "baseline.json"
# per-step statistics (each one a time series in summary.json's layer_series)
SERIES_KEYS = ("var_growth", "grad_spread", "grad_cv", "massive_ratio_max", "logit_maxabs")


def finite(x) -> bool:
    """A real number; metrics.jsonl stores +-inf as +-1e308 (JSON has no inf), so those are not."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and abs(x) < 1e308


# ----------------------------------------------------------------------------- baseline


def unigram_entropy(tokens: np.ndarray) -> float:
    """Entropy (nats) of the token frequencies of ``tokens``: the cross-entropy on ``tokens`` of the
    best context-free predictor (the empirical unigram distribution itself)."""
    if not isinstance(tokens, np.ndarray):  # shards or a mixture (data/pipeline): their tokens, as stored
        tokens = np.asarray(tokens)
    counts = np.zeros(1, dtype=np.int64)
    for i in range(0, len(tokens), 1 << 24):  # in chunks: a 100M-token shard is not copied to int64 at once
        chunk = np.bincount(np.asarray(tokens[i : i + (1 << 24)], dtype=np.int64))
        counts = np.pad(counts, (0, max(0, len(chunk) - len(counts))))
        counts[: len(chunk)] += chunk
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def baseline_loss(data) -> float:
    """The no-context baseline of a (corpus, tokenizer): unigram entropy of the validation split.

    ``data`` is a :class:`normbench.data.corpus.TokenData`; the value is cached next to its token ids
    (``<cache entry>/baseline.json``), so it is computed once per cache entry. A read-only cache
    only costs a recount."""
    path = Path(data.cache_path) / BASELINE_FILE
    try:
        cached = json.loads(path.read_text())
        if cached.get("n_val") == len(data.val) and finite(cached.get("unigram_entropy_val")):
            return float(cached["unigram_entropy_val"])
    except (OSError, ValueError, AttributeError):
        pass
    value = unigram_entropy(data.val)
    try:  # atomic: parallel jobs may race on a cold entry; both write the same value
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".baseline-")
        with os.fdopen(fd, "w") as f:
            json.dump({"unigram_entropy_val": value, "n_val": len(data.val)}, f)
        os.replace(tmp, path)
    except OSError:
        pass
    return value


# ----------------------------------------------------------------------------- outcome


def classify(status, best_val_loss, baseline, n_spikes, margin: float = STUCK_MARGIN) -> str | None:
    """The run's outcome (module docstring); None when it has none or it cannot be told
    (no val loss or no baseline recorded)."""
    if status == "diverged":
        return "diverged"
    if status != "completed" or not finite(best_val_loss) or not finite(baseline):
        return None
    if best_val_loss > baseline - margin:
        return "stuck"
    return "unstable" if (n_spikes or 0) > 0 else "learned"


def spike_steps(records: list[dict], pending: list[int] = ()) -> list[int]:
    """Every spike step in the records (a resumed run logs some steps twice), plus ``pending``
    ones not logged yet; sorted, at most :data:`MAX_SPIKE_STEPS`."""
    return History(records).spike_steps(pending)


# ----------------------------------------------------------------------------- per-layer statistics


def _list(record: dict, key: str) -> list[float] | None:
    v = record.get(key)
    return v if isinstance(v, list) and v and all(finite(x) for x in v) else None


def step_stats(record: dict) -> dict[str, float]:
    """The per-layer statistics of one diagnostic record (keys of :data:`SERIES_KEYS` it has data for):

    - ``var_growth``: ``var_resid`` after the last block / after the first block (index L / index 1;
      index 0 is the embedding output, which is not a block);
    - ``grad_spread``: ``grad_norm_layer`` of the first block / of the last block;
    - ``grad_cv``: coefficient of variation of ``grad_norm_layer`` (population std / mean);
    - ``massive_ratio_max``: the largest ``massive_ratio_resid`` over the layers;
    - ``logit_maxabs``: as recorded.
    """
    out = {}
    var = _list(record, "var_resid")
    if var and len(var) >= 2 and var[1] > 0:
        out["var_growth"] = var[-1] / var[1]
    grad = _list(record, "grad_norm_layer")
    if grad:
        if grad[-1] > 0:
            out["grad_spread"] = grad[0] / grad[-1]
        mean = statistics.fmean(grad)
        if mean > 0:
            out["grad_cv"] = statistics.pstdev(grad) / mean
    ratio = _list(record, "massive_ratio_resid")
    if ratio:
        out["massive_ratio_max"] = max(ratio)
    if finite(record.get("logit_maxabs")):
        out["logit_maxabs"] = float(record["logit_maxabs"])
    return out


class History:
    """What a run's end needs from its records (spike steps, per-layer statistics), gathered record by
    record: the recorder adds each one as it writes it, so the end of a run reads no file."""

    def __init__(self, records: list[dict] = ()):
        self.stats: dict[int, dict] = {}  # step -> step_stats of its diagnostic record
        self.spikes: set[int] = set()
        for record in records:
            self.add(record)

    def add(self, record: dict) -> None:
        """A record as written (a later record of the same step wins: a resumed run)."""
        if type(record.get("step")) is int and (stats := step_stats(record)):
            self.stats[record["step"]] = stats
        self.spikes |= {int(s) for s in (record.get("spike_steps") or []) if isinstance(s, int)}

    def spike_steps(self, pending: list[int] = ()) -> list[int]:
        return sorted(self.spikes | {int(s) for s in pending})[:MAX_SPIKE_STEPS]

    def layer_series(self) -> dict[str, list[list[float]]]:
        by_step = self.stats
        return {
            key: [[s, by_step[s][key]] for s in sorted(by_step) if key in by_step[s]]
            for key in SERIES_KEYS
            if any(key in v for v in by_step.values())
        }


def layer_series(records: list[dict]) -> dict[str, list[list[float]]]:
    """Each statistic of :func:`step_stats` as ``[[step, value], ...]`` over the diagnostic
    records, sorted by step (a later record of the same step wins: a resumed run)."""
    return History(records).layer_series()


def layer_stats(series: dict[str, list[list[float]]], threshold: float = MASSIVE_THRESHOLD) -> dict:
    """End-of-run scalars from :func:`layer_series`: ``var_growth``, ``grad_spread``, ``grad_cv`` and
    ``logit_maxabs`` at the last diagnostic step; ``massive_ratio_peak`` (largest over the run) and
    ``massive_ratio_step`` (the first step above ``threshold``, None if never). Missing data: None."""
    last = lambda key: series[key][-1][1] if series.get(key) else None
    ratio = series.get("massive_ratio_max") or []
    return {
        "var_growth": last("var_growth"),
        "grad_spread": last("grad_spread"),
        "grad_cv": last("grad_cv"),
        "massive_ratio_peak": max((v for _, v in ratio), default=None),
        "massive_ratio_step": next((s for s, v in ratio if v > threshold), None),
        "massive_threshold": threshold,
        "logit_maxabs": last("logit_maxabs"),
    }


def run_results(summary: dict, history: History, baseline: float | None, pending_spikes=()) -> dict:
    """The summary.json keys this module adds at the end of a run (recorder.Recorder.finish):
    ``outcome``, ``baseline_loss``, ``stuck_margin``, ``n_spikes``, ``spike_steps``, the
    :func:`layer_stats` scalars and ``layer_series``, from the run's records (``history``)."""
    n_spikes = int(summary.get("spikes") or 0)
    series = history.layer_series()
    return {
        "outcome": classify(summary.get("status"), summary.get("best_val_loss"), baseline, n_spikes),
        "baseline_loss": baseline,
        "stuck_margin": STUCK_MARGIN,
        "n_spikes": n_spikes,
        "spike_steps": history.spike_steps(pending_spikes),
        **layer_stats(series),
        "layer_series": series,
    }
