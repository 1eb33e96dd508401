"""The training sampler: random windows of a token array, one generator for the whole global batch.

nanoGPT's ``get_batch`` (random offsets into one token array), made rank-aware: every rank
draws the same global batch of ``batch_size * grad_accum`` offsets and reads only its own
micro-batches, so N processes see exactly what one process with the same global batch would.
The generator's state is the data position a checkpoint carries (train/state.py).
"""

from __future__ import annotations

import numpy as np
import torch


class Batches:
    """Random windows of ``seq_len + 1`` tokens; inputs and targets are the window shifted by one."""

    def __init__(self, tokens: np.ndarray, batch_size: int, seq_len: int, seed: int, device):
        self.tokens, self.batch_size, self.seq_len, self.device = tokens, batch_size, seq_len, device
        self.gen = torch.Generator().manual_seed(seed)
        self.arange = np.arange(seq_len + 1)

    def starts(self, n: int) -> np.ndarray:
        return torch.randint(len(self.tokens) - self.seq_len - 1, (n,), generator=self.gen).numpy()

    def gather(self, starts: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(self.tokens[starts[:, None] + self.arange].astype(np.int64))

    def windows(self, n: int) -> torch.Tensor:
        return self.gather(self.starts(n))

    def global_step(self, grad_accum: int, rank: int, world: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        # draw the whole global batch's offsets (cheap), read only this rank's windows
        starts = self.starts(self.batch_size * grad_accum).reshape(grad_accum, self.batch_size)
        out = []
        for micro in range(rank, grad_accum, world):
            chunk = self.gather(starts[micro])
            if self.device.type == "cuda":
                chunk = chunk.pin_memory().to(self.device, non_blocking=True)
            out.append((chunk[:, :-1], chunk[:, 1:]))
        return out


def fixed_batches(tokens: np.ndarray, n: int, batch_size: int, seq_len: int, seed: int) -> list[torch.Tensor]:
    """Deterministic windows, the same for every run (validation, diagnostics)."""
    b = Batches(tokens, batch_size, seq_len, seed, torch.device("cpu"))
    return [b.windows(batch_size) for _ in range(n)]
