"""A deterministic synthetic dataset: the same global batch for step k on every rank and every strategy.

Sequences come from a fixed random Markov chain over the vocabulary: each token is followed by one of
``branching`` successors drawn uniformly, so the loss has a known floor (ln ``branching`` nats) that a
model can approach, and batch k depends only on (seed, k) - not on the number of ranks. A strategy
takes its data-parallel slice of the global batch, so every run sees exactly the tokens the
single-process reference sees.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SyntheticData:
    """Global batches of (inputs, targets) token ids, shape (global_batch, seq_len) each."""

    vocab_size: int
    """Token ids are in [0, vocab_size)."""
    seq_len: int
    """Tokens per sequence (the targets are the inputs shifted by one)."""
    global_batch: int
    """Sequences per optimizer step, summed over data-parallel ranks."""
    seed: int = 1234
    """Seed of the Markov chain and of the batch stream."""
    branching: int = 4
    """Successors per token; the loss floor is ln(branching)."""

    @property
    def loss_floor(self) -> float:
        """Cross-entropy (nats) of a model that has learnt the chain exactly."""
        return math.log(self.branching)

    def _table(self) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed)
        return torch.randint(0, self.vocab_size, (self.vocab_size, self.branching), generator=g)  # (V, k)

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of step ``step``: (global_batch, seq_len) int64 each."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        table = self._table()
        toks = torch.empty(self.global_batch, self.seq_len + 1, dtype=torch.long)
        toks[:, 0] = torch.randint(0, self.vocab_size, (self.global_batch,), generator=g)
        choice = torch.randint(0, self.branching, (self.global_batch, self.seq_len), generator=g)
        for j in range(self.seq_len):
            toks[:, j + 1] = table[toks[:, j], choice[:, j]]
        return toks[:, :-1], toks[:, 1:]

    def shard(self, step: int, dp_rank: int, dp_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``dp_rank``-th of ``dp_size`` equal slices of step ``step``'s global batch."""
        if self.global_batch % dp_size:
            raise ValueError(f"global batch {self.global_batch} is not divisible by {dp_size} data-parallel ranks")
        x, y = self.batch(step)
        n = self.global_batch // dp_size
        return x[dp_rank * n:(dp_rank + 1) * n], y[dp_rank * n:(dp_rank + 1) * n]
