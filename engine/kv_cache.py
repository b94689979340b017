"""Paged KV blocks: the block manager and the cache tensors. Block 0 is never handed out (padded rows of
a captured step point at it); hedge scratch blocks lie outside the pool (engine/hedge/scratch.py).
"""

from __future__ import annotations

from collections import deque

import torch

NULL_BLOCK = 0


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 2:
            raise ValueError(f"need at least 2 KV blocks (block 0 is reserved), got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(1, num_blocks))
        self._used: set[int] = set()

    @property
    def capacity(self) -> int:
        """Blocks a single request could ever get."""
        return self.num_blocks - 1

    @property
    def num_free(self) -> int:
        return len(self._free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= len(self._free)

    def allocate(self, num_blocks: int) -> list[int]:
        if num_blocks > len(self._free):
            raise RuntimeError(f"asked for {num_blocks} KV blocks, {len(self._free)} free")
        blocks = [self._free.popleft() for _ in range(num_blocks)]
        self._used.update(blocks)
        return blocks

    def free(self, blocks: list[int]) -> None:
        for block in blocks:
            if block not in self._used:
                raise RuntimeError(f"KV block {block} freed twice or never allocated")
            self._used.remove(block)
            self._free.append(block)


def allocate_kv_cache(
    num_layers: int,
    num_blocks: int,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer (k, v), each [num_blocks, block_size, num_kv_heads, head_dim], zeroed so padded
    rows never read NaN."""
    storage = torch.zeros(num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype, device=device)
    return [(storage[i, 0], storage[i, 1]) for i in range(num_layers)]


def kv_bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    return num_layers * 2 * block_size * num_kv_heads * head_dim * torch.finfo(dtype).bits // 8
