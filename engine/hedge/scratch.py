"""Scratch KV for hedge chains: blocks reserved at engine start outside the pool, a chain's table row its
request's committed blocks then scratch ones (docs/design/hedging.md, "Scratch KV")."""

from __future__ import annotations

from typing import Protocol

import torch

from engine.request import Request


class ChainTables(Protocol):
    """What scratch KV needs of the runner (engine/runner.py ModelRunner)."""

    block_size: int
    block_tables: torch.Tensor  # [rows, max blocks per request] int32
    chain_row0: int  # the first block-table row of the hedge chains
    kv: list[tuple[torch.Tensor, torch.Tensor]]

    def set_table_rows(self, first: int, tables: torch.Tensor) -> None: ...


def chain_blocks(span: int, block_size: int) -> int:
    """Blocks a span of `span` rows can touch from any offset inside a block."""
    return -(-(span + block_size - 1) // block_size)


def copy_blocks(kv: list[tuple[torch.Tensor, torch.Tensor]], src: list[int], dst: list[int]) -> None:
    """KV blocks src -> dst in every layer (K and V); one copy when the layers share one storage."""
    if not src:
        return
    device = kv[0][0].device
    s = torch.tensor(src, dtype=torch.int64, device=device)
    d = torch.tensor(dst, dtype=torch.int64, device=device)
    base = kv[0][0]._base
    if base is not None and base.dim() == 6 and all(k._base is base and v._base is base for k, v in kv):
        base.index_copy_(2, d, base.index_select(2, s))  # [layers, 2, blocks, ...]
        return
    for k, v in kv:
        k.index_copy_(0, d, k.index_select(0, s))
        v.index_copy_(0, d, v.index_select(0, s))


class ScratchKV:
    def __init__(self, runner: ChainTables, first_block: int, chains: int, per_chain: int):
        self.runner, self.first, self.chains, self.per_chain = runner, first_block, chains, per_chain
        self.bs = runner.block_size

    def blocks(self, chain: int) -> list[int]:
        start = self.first + chain * self.per_chain
        return list(range(start, start + self.per_chain))

    def prepare(self, owners: list[Request], span: int) -> list[int]:
        """Chain i (of request owners[i]) gets table row chain_row0 + i; returns those rows."""
        if len(owners) > self.chains:
            raise RuntimeError(f"{len(owners)} hedge chains but scratch for {self.chains}")
        width = self.runner.block_tables.shape[1]
        tables = torch.zeros(len(owners), width, dtype=torch.int32)
        src, dst = [], []
        for i, r in enumerate(owners):
            first, last = r.num_kv // self.bs, (r.num_kv + span - 1) // self.bs
            if last - first + 1 > self.per_chain:
                raise RuntimeError(f"{r.id}: a span of {span} needs {last - first + 1} scratch blocks")
            mine = self.blocks(i)
            tables[i, :first] = torch.tensor(r.blocks[:first], dtype=torch.int32)
            tables[i, first : last + 1] = torch.tensor(mine[: last - first + 1], dtype=torch.int32)
            if r.num_kv % self.bs:  # the committed rows of the partial block must be visible
                src.append(r.blocks[first])
                dst.append(mine[0])
        row0 = self.runner.chain_row0
        self.runner.set_table_rows(row0, tables)
        copy_blocks(self.runner.kv, src, dst)
        return list(range(row0, row0 + len(owners)))

    def commit(self, winners: list[tuple[int, Request, int, int]]) -> None:
        """winners: (chain index, request, num_kv before the round, accepted rows) -> copy the
        chain's accepted span rows from scratch into the request's own blocks."""
        src, dst = [], []
        for chain, r, num_kv, rows in winners:
            first, last = num_kv // self.bs, (num_kv + rows - 1) // self.bs
            src += self.blocks(chain)[: last - first + 1]
            dst += r.blocks[first : last + 1]
        copy_blocks(self.runner.kv, src, dst)
