"""The progress of a prepare: a tqdm bar on a terminal, a log line every 30 s elsewhere (a SLURM log, a
pipe), each with documents, tokens, MB/s, tokens/s and, where the corpus' size is known, an ETA."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from normbench.data.cache import fmt

LOG_EVERY_S = 30.0


class Progress:
    def __init__(self, desc: str, total_bytes: int | None, log: Callable[[str], Any]):
        self.desc, self.total, self.log = desc, total_bytes, log
        self.t0 = self.last = time.time()
        self.bytes = self.docs = self.tokens = 0
        self.bar = None
        if sys.stderr.isatty():
            from tqdm.auto import tqdm  # start-up cost: only when preparing on a terminal

            self.bar = tqdm(total=total_bytes, unit="B", unit_scale=True, unit_divisor=1000, desc=desc, smoothing=0.1)

    def update(self, n_bytes: int, n_docs: int, tokens: int) -> None:
        self.bytes += n_bytes
        self.docs += n_docs
        self.tokens = tokens
        rate = self.tokens / max(time.time() - self.t0, 1e-9)
        stats = f"{self.docs:,} docs, {fmt(self.tokens)} tokens, {fmt(int(rate))} tok/s"
        if self.bar is not None:
            self.bar.update(n_bytes)
            self.bar.set_postfix_str(stats, refresh=False)
        elif time.time() - self.last >= LOG_EVERY_S:
            self.last = time.time()
            self.log(f"{self.desc}: {self._done()}{stats}, {self.bytes / 1e6 / (self.last - self.t0):.1f} MB/s")

    def _done(self) -> str:
        if not self.total:
            return f"{self.bytes / 1e6:,.0f} MB read, "
        left = (self.total - self.bytes) / max(self.bytes, 1) * (time.time() - self.t0)
        return f"{min(self.bytes / self.total, 1):.0%} of ~{self.total / 1e6:,.0f} MB (ETA {left / 60:.0f} min), "

    def close(self) -> None:
        if self.bar is not None:
            self.bar.total = self.bar.n  # file bytes were the estimate; text bytes are what was read
            self.bar.close()
        seconds = max(time.time() - self.t0, 1e-9)
        self.log(
            f"{self.desc}: {self.docs:,} documents, {fmt(self.tokens)} tokens in {seconds:.0f} s "
            f"({self.bytes / 1e6 / seconds:.1f} MB/s, {fmt(int(self.tokens / seconds))} tok/s)"
        )
