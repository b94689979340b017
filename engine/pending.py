"""Drafter context rows that wait outside the drafter's KV, and their store.

Two kinds of round leave a request's feature rows waiting: a winning hedge chain hands its rows over
(`Request.ctx_pending`, kept as (tensor, first row, count)), and a gated round defers the row of the
token it committed (`Request.ctx_deferred` rows in this module's stash, one row of the stash per
block-table slot). Deferring keeps a gated round at the cost of a plain step: storing a row projects
it through the drafter's fc and every layer's k|v (~0.1 ms a round at batch 64-256 on the H200 4B
pair), a request that finishes while gated never pays it, and one store serves many rounds' rows
with one pass over those weights. Rows are stored before the request drafts again, or once it holds
`MAX_DEFERRED` of them. The stash is written and read on the device with per-request indices, so a
store costs host work per request, not per row.
"""

from __future__ import annotations

import torch

from engine.request import Request, Rows
from engine.runner import ModelRunner

MAX_DEFERRED = 32  # stash rows per slot: 4B pair, 257 slots of 32 x 12,800 bf16 features = 210 MB


def gather_rows(parts: list[Rows], to_device) -> torch.Tensor:
    """The row blocks `parts` (tensor, first row, count), stacked in order: one concatenation of the
    distinct tensors and one gather, not a copy per block."""
    offsets: dict[int, int] = {}
    tensors: list[torch.Tensor] = []
    index: list[int] = []
    for base, first, count in parts:
        at = offsets.get(id(base))
        if at is None:
            at = offsets[id(base)] = sum(t.shape[0] for t in tensors)
            tensors.append(base)
        index += range(at + first, at + first + count)
    if len(tensors) == 1 and index == list(range(tensors[0].shape[0])):
        return tensors[0]
    return torch.cat(tensors).index_select(0, to_device(index))


class ContextStash:
    """The gated rounds' deferred feature rows, [slots, MAX_DEFERRED, features] on the device
    (allocated at the first gated round), and the store of every waiting row."""

    def __init__(self, runner: ModelRunner):
        self.runner = runner
        self.rows: torch.Tensor | None = None

    def defer(self, reqs: list[Request], features: torch.Tensor) -> None:
        """A gated round's feature rows, one per request, into its slot's next free stash row (each
        request's `ctx_deferred` before the round counts it)."""
        if self.rows is None:
            slots = self.runner.block_tables.shape[0]
            self.rows = features.new_empty(slots, MAX_DEFERRED, features.shape[1])
        at = self.runner.to_device([v for r in reqs for v in (r.slot, r.ctx_deferred)]).view(-1, 2)
        self.rows[at[:, 0], at[:, 1]] = features[: len(reqs)]

    def store_if_full(self, reqs: list[Request]) -> None:
        """After a gated round: the batch's rows are stored once one request fills its stash row."""
        if any(r.ctx_deferred >= MAX_DEFERRED for r in reqs):
            self.store(reqs)

    def store(self, reqs: list[Request]) -> None:
        """Every waiting row of these requests joins the drafter's KV: the hedge handovers', then the
        stash's, each in one store."""
        handed = [r for r in reqs if r.ctx_pending]
        if handed:
            parts, positions, slots = [], [], []
            for r in handed:
                span = range(r.draft_kv_len, r.draft_kv_len + r.handed_rows)
                parts += r.ctx_pending
                positions += span
                slots += self.runner.slots(r, span)
            self.runner.store_context(gather_rows(parts, self.runner.to_device), positions, slots)
        deferred = [r for r in reqs if r.ctx_deferred]
        if deferred:
            self._store_stash(deferred)
        for r in handed + deferred:
            r.context_flushed()

    def _store_stash(self, reqs: list[Request]) -> None:
        runner = self.runner
        total = sum(r.ctx_deferred for r in reqs)
        fields = runner.to_device([v for r in reqs for v in (r.slot, r.num_kv - r.ctx_deferred, r.ctx_deferred)])
        slot, start, count = fields.view(-1, 3).unbind(1)
        owner = torch.repeat_interleave(torch.arange(len(reqs), device=fields.device), count, output_size=total)
        first = torch.cumsum(count, 0) - count
        col = torch.arange(total, device=fields.device) - first[owner]
        positions = start[owner] + col
        bs = runner.block_size
        blocks = runner.block_tables[slot[owner], positions // bs].long()
        runner.drafter.store_context(
            self.rows[slot[owner], col], positions, blocks * bs + positions % bs, runner.draft_kv
        )
