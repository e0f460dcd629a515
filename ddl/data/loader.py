"""Batches of (x, y) windows from a split: seeded, restorable, disjoint across ranks."""

from __future__ import annotations

from typing import Iterator

import numpy as np
import torch

from .dataset import Split


class BatchLoader:
    """Samples (B, T+1) windows uniformly from a split's shards with a seeded generator.

    Every rank draws the same global batch of world_size * B windows and keeps rows
    [rank*B, (rank+1)*B): ranks read disjoint data, and world_size processes x B see exactly
    what one process x world_size*B sees (the property the DDP equivalence rests on).

    A batch is one copy of whole windows per shard it reads (no Python loop over rows or tokens); on CUDA it goes
    through pinned memory with a non-blocking copy, so the host queues the step without waiting
    for the GPU to drain.
    """

    def __init__(self, split: Split, batch_size: int, seq_len: int, seed: int, rank: int = 0, world_size: int = 1,
                 device: torch.device | None = None):
        self.split, self.batch_size, self.seq_len = split, batch_size, seq_len
        self.rank, self.world_size = rank, world_size
        self.device = device or torch.device("cpu")
        starts = np.array([max(len(s) - seq_len, 0) for s in split.shards])   # valid window starts per shard
        if starts.sum() == 0:
            raise ValueError(f"train.seq_len={seq_len}: longer than every shard of the split "
                             f"({split.tokens} tokens)")
        self._cumulative = np.cumsum(starts)
        self._first = np.concatenate(([0], self._cumulative))     # each shard's first draw
        # each shard as a (starts, T+1) strided view of its windows: a batch copies whole rows, no index arrays
        self._windows = [np.lib.stride_tricks.sliding_window_view(np.asarray(s), seq_len + 1) if len(s) > seq_len
                         else None for s in split.shards]
        self._rng = np.random.Generator(np.random.PCG64(seed))

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        draws = self._rng.integers(0, self._cumulative[-1], size=self.world_size * self.batch_size)
        mine = draws[self.rank * self.batch_size:(self.rank + 1) * self.batch_size]
        shard_ids = np.searchsorted(self._cumulative, mine, side="right")
        offsets = mine - self._first[shard_ids]
        rows = np.empty((len(mine), self.seq_len + 1), dtype=np.int64)
        for shard in np.unique(shard_ids):
            read = shard_ids == shard
            rows[read] = self._windows[shard][offsets[read]]
        batch = torch.from_numpy(rows)
        if self.device.type == "cuda":
            batch = batch.pin_memory().to(self.device, non_blocking=True)
        return batch[:, :-1], batch[:, 1:]

    def state_dict(self) -> dict:
        return {"rng": self._rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        self._rng.bit_generator.state = state["rng"]


def val_batches(split: Split, batch_size: int, seq_len: int,
                max_tokens: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The fixed held-out budget: contiguous, non-overlapping windows from the start of val."""
    tokens = split.concatenated()
    n_windows = min(max_tokens // seq_len, (len(tokens) - 1) // seq_len)
    if n_windows < 1:
        raise ValueError(f"train.seq_len={seq_len}: the val split ({len(tokens)} tokens) holds no full window")
    for first in range(0, n_windows, batch_size):
        idx = np.arange(first, min(first + batch_size, n_windows))[:, None] * seq_len + np.arange(seq_len + 1)
        rows = torch.from_numpy(tokens[idx].astype(np.int64))
        yield rows[:, :-1], rows[:, 1:]
