"""Drafter context rows that wait outside the drafter's KV, and their store.

Two kinds of round leave a request's feature rows pending (`Request.ctx_pending`): a winning hedge
chain hands its rows over, and a gated round defers the row of the token it committed. Deferring is
what keeps a gated round at the cost of a plain step: storing a row projects it through the drafter's
fc and every layer's k|v (~0.1 ms a round at batch 64-256 on the H200 4B pair), a request that
finishes while gated never pays it, and one flush stores many rounds' rows with one pass over those
weights. Rows are stored before the request drafts again, or once it holds `MAX_DEFERRED` of them
(which bounds the memory they hold: at most MAX_DEFERRED x feature_size values a request).
"""

from __future__ import annotations

import torch

from engine.request import Request, Rows
from engine.runner import ModelRunner

MAX_DEFERRED = 32  # pending rows at which a gated batch stores them (4B pair, batch 256: ~210 MB)


def gather_rows(parts: list[Rows], to_device) -> torch.Tensor:
    """The row blocks `parts` (tensor, first row, count), stacked in order: one concatenation of the
    distinct tensors (a gated round's rows share its batch's) and one gather, not a copy per block."""
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


def store_pending(runner: ModelRunner, reqs: list[Request]) -> None:
    """Every pending row of these requests joins the drafter's KV, in one store."""
    parts, positions, slots, owners = [], [], [], []
    for r in reqs:
        if r.ctx_pending:
            span = range(r.draft_kv_len, r.num_kv)
            parts += r.ctx_pending
            positions += span
            slots += runner.slots(r, span)
            owners.append(r)
    if parts:
        runner.store_context(gather_rows(parts, runner.to_device), positions, slots)
        for r in owners:
            r.context_flushed()


def store_if_full(runner: ModelRunner, reqs: list[Request]) -> None:
    """After a gated round: the batch's pending rows are stored once one request holds MAX_DEFERRED."""
    if any(len(r.ctx_pending) >= MAX_DEFERRED for r in reqs):
        store_pending(runner, reqs)
