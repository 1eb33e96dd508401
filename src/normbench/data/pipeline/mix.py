"""``data=mix data.mix=[DIR:WEIGHT,...]``: prepared corpora sampled with weights, deterministically.

Each item is a prepared entry (a directory with ``manifest.json``, as ``prepare`` prints it) and its
weight. The mixture is one array to the sampler (data/batches.py), so the sampler is unchanged: the
same global batch at any GPU count and the data position resumed exactly. Its index space is split
into one span per source, each as long as its weight's share; a window drawn in a source's span is
placed proportionally within that source's own windows. Every source is thus drawn from in proportion
to its weight (a small source is repeated, a large one sampled), as OLMo-core's and torchtitan's
mixtures with ratios do. The summary records the mixture (``data_mix``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from normbench.data.cache import fmt
from normbench.data.pipeline.prepare import read_manifest
from normbench.data.pipeline.shards import concatenated, read_shard
from normbench.data.texts import abs_path, cfg_value
from normbench.data.tokenizer import build_tokenizer
from normbench.errors import DataError

SPAN = 1 << 40  # the index space of the mixture (any window start below it)


class Mixed:
    """Sources indexed as one array whose windows fall in each source with its weight's probability."""

    def __init__(self, parts: list, weights: list[float], names: list[str]):
        total = float(sum(weights))
        self.parts, self.names = parts, names
        self.weights = [w / total for w in weights]
        self.ends = np.cumsum([int(SPAN * w) for w in self.weights])
        self.ends[-1] = SPAN
        self.dtype = np.result_type(*[p.dtype for p in parts])

    def __len__(self) -> int:
        return SPAN

    def __getitem__(self, index):
        """Windows (a 2-D array of consecutive indices, one per row, as the sampler asks)."""
        index = np.asarray(index)
        if index.ndim != 2:
            raise TypeError("a mixture is read as windows (rows of consecutive indices)")
        starts, offsets = index[:, 0], index - index[:, :1]
        which = np.searchsorted(self.ends, starts, side="right")
        out = np.empty(index.shape, dtype=self.dtype)
        for k in np.unique(which):
            sel = which == k
            begin = self.ends[k - 1] if k else 0
            room = len(self.parts[k]) - int(offsets.max()) - 1  # the source's own window starts
            if room <= 0:
                raise DataError(f"data.mix: {self.names[k]} holds fewer tokens than a window; leave it out")
            placed = ((starts[sel] - begin) * room) // (self.ends[k] - begin)
            out[sel] = self.parts[k][placed[:, None] + offsets[sel]]
        return out

    def __array__(self, dtype=None, copy=None):  # the whole mixture's tokens (statistics such as the baseline)
        out = np.concatenate([np.asarray(p) for p in self.parts])
        return out if dtype is None else out.astype(dtype)

    def describe(self) -> list[dict]:
        return [
            {"source": n, "weight": round(w, 6), "tokens": len(p)}
            for n, w, p in zip(self.names, self.weights, self.parts)
        ]


def parse_mix(items) -> list[tuple[Path, float]]:
    """``DIR:WEIGHT`` items (a bare DIR weighs 1) as (directory, weight); bad ones are one line."""
    if not items:
        raise DataError("data=mix needs data.mix=[DIR:WEIGHT,...] (prepared directories, as prepare prints them)")
    out = []
    for item in items:
        path, sep, weight = str(item).rpartition(":")
        path, weight = (path, weight) if sep else (weight, "1")
        try:
            w = float(weight)
        except ValueError:
            raise DataError(f"data.mix: {item!r} is not DIR:WEIGHT (a weight such as 0.7)") from None
        if not w > 0:
            raise DataError(f"data.mix: the weight of {item!r} must be > 0")
        out.append((abs_path(path), w))
    return out


def open_mix(cfg: Any, log: Callable[[str], Any]) -> tuple:
    """TokenData's fields for a mixture of prepared corpora, all made with the config's tokenizer."""
    name = cfg_value(cfg, "tokenizer")
    sources = parse_mix(cfg_value(cfg, "mix"))
    splits: dict[str, list] = {"train": [], "val": []}
    manifests = []
    for entry, _ in sources:
        manifest = read_manifest(entry)
        if manifest is None:
            raise DataError(f"data.mix: {entry} is no prepared corpus (no manifest.json); run prepare for it first")
        if manifest["tokenizer"] != build_tokenizer(name, manifest["vocab_size"], None, entry, eot=True).name:
            raise DataError(f"data.mix: {entry} was made with {manifest['tokenizer']}, not data.tokenizer={name}")
        for split in splits:
            splits[split].append(concatenated([read_shard(entry / r["file"]) for r in manifest["shards"][split]]))
        manifests.append(manifest)
    names, weights = [str(e) for e, _ in sources], [w for _, w in sources]
    train, val = (Mixed(splits[s], weights, names) for s in ("train", "val"))
    tokenizer = build_tokenizer(name, manifests[0]["vocab_size"], None, sources[0][0], eot=True)
    log(
        "mix: "
        + ", ".join(
            f"{Path(n).name} x{w:.3g} ({fmt(len(p))} tokens)" for n, w, p in zip(names, train.weights, train.parts)
        )
    )
    return train, val, tokenizer.vocab_size, tokenizer, sources[0][0], True, 0
