"""A paged KV cache for the runtime: fixed-size blocks in a pool, a block table per sequence (PagedAttention).

Kwon et al. 2023, "Efficient Memory Management for Large Language Model Serving with PagedAttention", SOSP,
arXiv 2309.06180 §4.2: the cache of each layer is a pool of blocks of ``block_size`` tokens, (num_blocks,
block_size, kv_heads_local, head_dim) for K and for V; a sequence's logical block j lives in physical block
``table[j]``, taken from a free list as the sequence grows (here from the end of the pool, so a sequence's blocks
are not contiguous and the indirection is exercised). A block id covers every layer the rank holds, as in vLLM.
The bytes of one block on a rank are ``2 · layers · block_size · kv_heads_local · head_dim · elem`` — the
memory model's ``block_size × KV bytes per token`` (``memory.inference.kv_blocks``).
"""

from __future__ import annotations

import torch

from shardlab.errors import ShardlabError

BLOCK_SIZE = 16
"""Tokens per block (vLLM's default ``--block-size``)."""


def blocks_for(tokens: int, block_size: int = BLOCK_SIZE) -> int:
    """Blocks a sequence of ``tokens`` tokens occupies: ceil(tokens / block_size)."""
    return -(-tokens // block_size)


class PagedKVCache:
    """Paged K/V for the blocks ``layers`` of one rank, batch 1 (module doc)."""

    def __init__(self, layers: list[int], num_blocks: int, kv_heads_local: int, head_dim: int,
                 block_size: int = BLOCK_SIZE, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        shape = (num_blocks, block_size, kv_heads_local, head_dim)
        self.block_size, self.num_blocks = block_size, num_blocks
        self.k = {i: torch.zeros(shape, dtype=dtype, device=device) for i in layers}
        self.v = {i: torch.zeros(shape, dtype=dtype, device=device) for i in layers}
        self.free = list(range(num_blocks))        # popped from the end: physical blocks in reverse order
        self.table: list[int] = []                 # logical block j -> physical block

    def _reserve(self, tokens: int) -> None:
        while len(self.table) * self.block_size < tokens:
            if not self.free:
                raise ShardlabError(f"the KV cache's {self.num_blocks} blocks of {self.block_size} tokens are full")
            self.table.append(self.free.pop())

    def _slots(self, start: int, end: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        pos = torch.arange(start, end, device=device)
        table = torch.tensor(self.table, device=device)
        return table[pos // self.block_size], pos % self.block_size   # (n,) physical block, (n,) offset

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor, start_pos: int):
        """Write k, v (1, s, kv, hd) at positions start_pos.. and return the sequence's whole K, V (1, start_pos+s, kv, hd)."""
        end = start_pos + k.shape[1]
        self._reserve(end)
        blk, off = self._slots(start_pos, end, k.device)
        self.k[layer][blk, off] = k[0]
        self.v[layer][blk, off] = v[0]
        blk, off = self._slots(0, end, k.device)
        return self.k[layer][blk, off][None], self.v[layer][blk, off][None]

    @property
    def blocks_used(self) -> int:
        return len(self.table)

    @property
    def bytes_per_block(self) -> int:
        """K and V of one block over every layer held."""
        return sum(t[0].numel() * t.element_size() for d in (self.k, self.v) for t in d.values())

    @property
    def nbytes(self) -> int:
        """Bytes allocated for the pool on this rank."""
        return sum(t.untyped_storage().nbytes() for d in (self.k, self.v) for t in d.values())
