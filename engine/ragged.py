"""The ragged verify (SPEC 10, spans per request): request i's span [current, d1..dK_i] for its own K_i,
sum(1 + K_i) flat rows in one target forward, accepted on the device like a uniform verify.

With graphs a step of n requests runs at its request bucket m and the row bucket m * S, S the least of
`ragged_spans` holding the rows; a graph is replayed only for exactly the (m, m * S) it was captured
at. Padding rows sit in no sequence at position -1 (no K/V written, none attended, their outputs never
read); padding requests are empty spans on the null row. Eager, the step runs its exact rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from itertools import accumulate
from typing import Any

import torch

from engine.kernels.span_meta import ragged_layout, ragged_meta, ragged_span
from engine.models.layers import AttnMeta
from engine.request import Request

ModelRunner = Any  # engine/runner.py's, which sits below the round (this module must not import it)
AcceptRule = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def ragged_rows(runner: ModelRunner, n: int, total: int) -> tuple[int, int]:
    """(request bucket m, rows) a ragged step of n requests and `total` real rows runs at."""
    m = runner.graphs.rows(n)
    if runner.graphs.bucket(n) is None:
        return m, total
    return m, m * ragged_span(runner.drafter.cfg.drafts_per_round, m, total)


def ragged_verify(
    runner: ModelRunner, reqs: list[Request], drafts: torch.Tensor, ks: Sequence[int], accept: AcceptRule
) -> tuple[tuple, torch.Tensor, list[int]]:
    """The staged requests' spans of ks[i] drafts each (drafts [N, >= max ks], device), accepted on the
    device against the greedy targets under the staged limits (each <= its ks[i]). Returns
    (logits, greedy, features) of the sum(1 + ks) real rows, the accept rule's rows (int64 [N, 2P + 2],
    P the drafter's drafts per round; targets past a request's span repeat its last) and each
    request's first row."""
    runner.inputs.check(reqs)
    n, per_round = len(reqs), runner.drafter.cfg.drafts_per_round
    if not all(0 <= k <= min(per_round, drafts.shape[1]) for k in ks) or len(ks) != n:
        raise ValueError(f"ragged spans {list(ks)} for {n} requests with {drafts.shape[1]} drafts each")
    starts = list(accumulate((1 + k for k in ks), initial=0))
    m, rows = ragged_rows(runner, n, starts[-1])
    width = 1 + per_round
    layout = ragged_layout(ks, [r.num_kv for r in reqs], [r.slot for r in reqs], width, m, rows, runner.null_row)
    full = torch.zeros(n, per_round, dtype=torch.int64, device=runner.device)
    full[:, : drafts.shape[1]] = drafts[:, :per_round]
    host = torch.from_numpy(layout)
    if runner.device.type == "cuda":
        host = host.pin_memory()
    values = {"drafts": full, "layout": host.to(runner.device, non_blocking=True)}
    fn = partial(_ragged_step, runner, m=m, rows=rows, accept=accept)
    out = runner.graphs.run(("ragged", rows, accept), fn, n, values, {"drafts": 0}, frozenset({"layout"}))
    logits, greedy, features, accepted = out
    total = starts[-1]
    res = (logits[:total], greedy[:total], None if features is None else features[:total])
    return res, accepted[:n], starts[:-1]


def _ragged_step(runner: ModelRunner, drafts: torch.Tensor, layout: torch.Tensor, m: int, rows: int, accept) -> tuple:
    width = drafts.shape[1] + 1
    src, (positions, slots, tables, seq_lens, qsl), inv = ragged_meta(
        runner.block_tables, layout, width, m, rows, runner.block_size
    )
    ids = torch.cat([runner.field("token", m)[:, None], drafts], dim=1).reshape(-1).index_select(0, src)
    meta = AttnMeta(slots, tables, seq_lens, qsl, width, causal=True)
    logits, greedy, features = runner.flat_forward(ids, positions, meta)
    targets = greedy.index_select(0, inv.reshape(-1)).view(m, width)
    return logits, greedy, features, accept(drafts, targets, runner.field("limit", m))
