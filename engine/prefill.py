"""The prefill step: whole prompts (`prefill_ids`) through the target, with a drafter their feature rows
stored as its context; graphed up to PREFILL_GRAPH_TOKENS tokens, else eager (docs/design/engine.md)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from itertools import accumulate
from typing import Any, Protocol

import torch

from engine.kernels._triton import next_pow2
from engine.models.layers import AttnMeta
from engine.request import Request


class ModelRunner(Protocol):
    """What a prefill uses of engine/runner.py's ModelRunner (which imports this module)."""

    target: Any
    drafter: Any
    ops: Any
    graphs: Any
    kv: list
    draft_kv: list
    taps: tuple[int, ...]
    block_tables: torch.Tensor
    null_row: int
    prefill_staged: tuple[torch.Tensor, torch.Tensor] | None

    def slots(self, req: Request, positions: range) -> list[int]: ...
    def to_device(self, values: Sequence[int], dtype: torch.dtype = torch.int64) -> torch.Tensor: ...
    def features(self, rows: int) -> torch.Tensor | None: ...
    def logits_buffer(self, rows: int) -> torch.Tensor: ...


PREFILL_GRAPH_TOKENS = 2048  # longer prefills run eagerly
TOKEN_FIELDS, REQUEST_FIELDS = 3, 4  # (id, position, slot) per token; (row, length, start, last) per request


def prefill_bucket(tokens: int) -> int | None:
    """The token count a graphed prefill of `tokens` runs at (powers of two up to 256, then multiples
    of 256); None: eager."""
    if tokens > PREFILL_GRAPH_TOKENS:
        return None
    return max(16, next_pow2(tokens)) if tokens <= 256 else -(-tokens // 256) * 256


def query_bucket(longest: int, t: int) -> int:
    """The attention span a graphed prefill of token bucket t runs at: 16 * 4^i >= the longest prompt
    (programs past a prompt's end exit at once), capped at t."""
    q = 16
    while q < longest:
        q *= 4
    return min(q, t)


def request_bucket(buckets: Sequence[int], n: int) -> int:
    """The rows a graphed prefill of n requests runs at: the least power-of-two graph bucket >= n, or the
    widest bucket (prefill graphs need not follow the decode buckets between powers of two)."""
    return next((b for b in buckets if b >= n and not b & (b - 1)), max(buckets))


def prefill_shapes(buckets: Sequence[int], max_tokens: int) -> list[tuple[int, int, int]]:
    """Every graphed prefill key (token bucket t, span q, request bucket m) that a step of at most
    `max_tokens` prompt tokens over at most max(buckets) requests can reach (a superset: q spans from the
    shortest longest-prompt to the longest one of each (t, n))."""
    shapes, most, first = set(), max(buckets), 1
    for last in sorted({prefill_bucket(x) for x in range(1, min(max_tokens, PREFILL_GRAPH_TOKENS) + 1)}):
        t, last = last, min(last, max_tokens)  # totals first..last replay bucket t
        for n in range(1, min(most, last) + 1):
            q, top = query_bucket(-(-max(first, n) // n), t), query_bucket(last - n + 1, t)
            while True:
                shapes.add((t, q, request_bucket(buckets, n)))
                if q >= top:
                    break
                q = min(4 * q, t)
        first = t + 1
    return sorted(shapes)


def staged_buffers(width: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The graphed prefill's inputs: per token [3, PREFILL_GRAPH_TOKENS], per request [4, width + 1]."""
    tokens = torch.zeros(TOKEN_FIELDS, PREFILL_GRAPH_TOKENS, dtype=torch.int64, device=device)
    return tokens, torch.zeros(REQUEST_FIELDS, width + 1, dtype=torch.int64, device=device)


def prefill(runner: ModelRunner, reqs: list[Request]) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits and argmax at each request's last prefill row; the K/V (and drafter context) of every
    row written. Graphed when the runner has staged buffers and the tokens fit a bucket, else eager on
    the same inputs unpadded."""
    prompts = [r.prefill_ids for r in reqs]  # a property that builds its list: once a request
    lens = [len(p) for p in prompts]
    slots = [s for r, length in zip(reqs, lens, strict=True) for s in runner.slots(r, range(length))]
    starts = list(accumulate(lens, initial=0))
    total, n = starts[-1], len(reqs)
    t = prefill_bucket(total) if runner.prefill_staged is not None else None
    m, q = (n, max(lens)) if t is None else (request_bucket(runner.graphs.buckets, n), query_bucket(max(lens), t))
    pad, extra = (t or total) - total, m - n
    ids, positions = [token for p in prompts for token in p], [i for length in lens for i in range(length)]
    token_rows = [ids + [0] * pad, positions + [0] * pad, slots + [-1] * pad]
    request_rows = [
        [r.slot for r in reqs] + [runner.null_row] * (extra + 1),
        lens + [0] * (extra + 1),
        starts + [total] * extra,
        [s - 1 for s in starts[1:]] + [0] * (extra + 1),
    ]
    if t is None:
        tokens = runner.to_device([v for row in token_rows for v in row]).view(TOKEN_FIELDS, total)
        requests = runner.to_device([v for row in request_rows for v in row]).view(REQUEST_FIELDS, n + 1)
        return _forward(runner, tokens, requests, n, q)
    tokens, requests = runner.prefill_staged
    pinned = tokens.is_cuda
    tokens[:, :t].copy_(torch.tensor(token_rows, dtype=torch.int64, pin_memory=pinned), non_blocking=True)
    requests[:, : m + 1].copy_(torch.tensor(request_rows, dtype=torch.int64, pin_memory=pinned), non_blocking=True)
    logits, greedy = runner.graphs.run(("prefill", t, q), partial(_staged, runner, t, m, q), m, {}, {})
    return logits[:n], greedy[:n]


def warm_prefill(runner: ModelRunner, shapes: Sequence[tuple[int, int, int]]) -> None:
    """Run (capturing, unless frozen) the graphed prefill at each (t, q, m) on padding alone: every token
    slot -1, every request the null row with no tokens, so nothing is written to any cache. Nothing
    without staged buffers (no prefill is graphed)."""
    if runner.prefill_staged is None:
        return
    tokens, requests = runner.prefill_staged
    tokens.zero_(), tokens[2].fill_(-1)
    requests.zero_(), requests[0].fill_(runner.null_row)
    for t, q, m in shapes:
        runner.graphs.run(("prefill", t, q), partial(_staged, runner, t, m, q), m, {}, {})


def _staged(runner: ModelRunner, t: int, m: int, q: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The graphed body: the staged buffers' first t tokens and m requests (+ the end of the spans)."""
    tokens, requests = runner.prefill_staged
    return _forward(runner, tokens[:, :t], requests[:, : m + 1], m, q, out=runner.logits_buffer(m))


def _forward(runner: ModelRunner, tokens: torch.Tensor, requests: torch.Tensor, m: int, q: int, out=None) -> tuple:
    """tokens [3, T] (id, position, slot), requests [4, m + 1] (table row, length, start, last row; the
    last start ends the spans); q: the attention's span."""
    ids, positions, slots = tokens
    rows, lens, starts, last = requests
    tables = runner.block_tables.index_select(0, rows[:m])
    meta = AttnMeta(slots, tables, lens[:m].to(torch.int32), starts.to(torch.int32), q, causal=True)
    features = runner.features(ids.shape[0])
    hidden = runner.target.forward(ids, positions, meta, runner.kv, runner.taps, features)
    if features is not None:
        runner.drafter.store_context(features, positions, slots, runner.draft_kv)
    logits = runner.target.logits(hidden.index_select(0, last[:m]), out=out)
    return logits, runner.ops.argmax(logits)
