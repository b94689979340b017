"""A uniform span step's attention metadata from its staged per-request inputs, on the device (CUDA-graph
safe): request i's S rows sit at positions num_kv[i] .. num_kv[i] + S - 1, their KV slots come from
its block-table row rows[i], and it has num_kv[i] + S rows cached after the step. The reference is a
chain of torch ops, about ten kernels inside a captured step; the Triton kernel is one launch. A ragged
step (1 + K_i rows for request i) lays its rows out on the host (`ragged_layout`, one array staged in
one copy) and derives the same metadata on the device (`ragged_meta`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from engine.kernels._triton import jit, next_pow2

SpanMeta = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def span_meta_ref(
    block_tables: torch.Tensor, rows: torch.Tensor, num_kv: torch.Tensor, span: int, block_size: int
) -> SpanMeta:
    """(positions [n*S] int64, slots [n*S] int64, tables [n, max_blocks] int32 (the rows' table rows),
    seq_lens [n] int32, query_start_loc [n+1] int32) for n requests of span S."""
    n = rows.shape[0]
    positions = num_kv[:, None] + torch.arange(span, device=num_kv.device)[None, :]
    tables = block_tables.index_select(0, rows)
    blocks = tables.gather(1, positions // block_size).long()
    slots = (blocks * block_size + positions % block_size).reshape(-1)
    qsl = torch.arange(n + 1, dtype=torch.int32, device=num_kv.device) * span
    return positions.reshape(-1), slots, tables, (num_kv + span).to(torch.int32), qsl


# --- Triton ---------------------------------------------------------------------------------
tl = None  # triton.language, bound by _triton.bind at the first launch


@jit
def _span_meta_kernel(
    bt_ptr,
    rows_ptr,
    num_kv_ptr,
    pos_ptr,
    slot_ptr,
    tables_ptr,
    seq_lens_ptr,
    qsl_ptr,
    n,
    max_blocks,
    stride_bt,
    SPAN: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    i = tl.program_id(0)
    kv = tl.load(num_kv_ptr + i)
    src = bt_ptr + tl.load(rows_ptr + i) * stride_bt
    for start in range(0, max_blocks, BLOCK_T):
        c = start + tl.arange(0, BLOCK_T)
        ok = c < max_blocks
        tl.store(tables_ptr + i * max_blocks + c, tl.load(src + c, mask=ok), mask=ok)
    s = tl.arange(0, BLOCK_S)
    ok = s < SPAN
    pos = kv + s
    blk = tl.load(src + pos // PAGE, mask=ok, other=0).to(tl.int64)
    tl.store(pos_ptr + i * SPAN + s, pos, mask=ok)
    tl.store(slot_ptr + i * SPAN + s, blk * PAGE + pos % PAGE, mask=ok)
    tl.store(seq_lens_ptr + i, (kv + SPAN).to(tl.int32))
    tl.store(qsl_ptr + i, i * SPAN)
    if i == n - 1:
        tl.store(qsl_ptr + n, n * SPAN)


def span_meta(
    block_tables: torch.Tensor, rows: torch.Tensor, num_kv: torch.Tensor, span: int, block_size: int
) -> SpanMeta:
    """Triton `span_meta_ref`: one program per request."""
    n, max_blocks = rows.shape[0], block_tables.shape[1]
    dev = num_kv.device
    positions = torch.empty(n * span, dtype=torch.int64, device=dev)
    slots = torch.empty(n * span, dtype=torch.int64, device=dev)
    tables = torch.empty(n, max_blocks, dtype=block_tables.dtype, device=dev)
    seq_lens = torch.empty(n, dtype=torch.int32, device=dev)
    qsl = torch.empty(n + 1, dtype=torch.int32, device=dev)
    if not n:
        return positions, slots, tables, seq_lens, qsl.zero_()
    _span_meta_kernel[(n,)](
        block_tables,
        rows,
        num_kv,
        positions,
        slots,
        tables,
        seq_lens,
        qsl,
        n,
        max_blocks,
        block_tables.stride(0),
        SPAN=span,
        PAGE=block_size,
        BLOCK_S=next_pow2(span),
        BLOCK_T=min(1024, next_pow2(max_blocks)),
        num_warps=1,
    )
    return positions, slots, tables, seq_lens, qsl


# --- ragged spans ---------------------------------------------------------------------------
def ragged_spans(per_round: int) -> list[int]:
    """The spans a ragged verify's row bucket is a multiple of: 1 + K for K a power of two below
    `per_round`, and 1 + per_round (the uniform variants' spans)."""
    return sorted({1 + (1 << i) for i in range(per_round.bit_length()) if 1 << i < per_round} | {1 + per_round})


def ragged_span(per_round: int, requests: int, rows: int) -> int:
    """S of a ragged verify's row bucket requests x S: the least of `ragged_spans` holding `rows`."""
    return next(s for s in ragged_spans(per_round) if requests * s >= rows)


def ragged_layout(
    drafts: Sequence[int],
    num_kv: Sequence[int],
    table_rows: Sequence[int],
    width: int,
    m: int,
    rows: int,
    null_row: int,
) -> np.ndarray:
    """Host layout of a ragged verify: request i's 1 + drafts[i] rows at positions num_kv[i] ..,
    flat and in request order, then rows - sum(1 + drafts) padding rows in no sequence (position -1:
    nothing written, nothing attended); requests past len(drafts) up to m are empty, on `null_row`.
    One int64 array: per row [src (into the [m, width] id matrix), position, table row], per matrix
    entry [inv: the flat row of request i's target j (past its span: its last row)], per request
    [table row, seq_len, query start] and the end of the last span."""
    n = len(drafts)
    k = np.asarray(drafts, dtype=np.int64)
    starts = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(k + 1, out=starts[1 : n + 1])
    starts[n + 1 :] = starts[n]
    total = int(starts[n])
    owner = np.repeat(np.arange(n), k + 1)
    within = np.arange(total) - starts[owner]
    kv, tab = np.asarray(num_kv, dtype=np.int64), np.asarray(table_rows, dtype=np.int64)
    per_row = np.full((3, rows), -1, dtype=np.int64)
    per_row[0, :total], per_row[1, :total], per_row[2, :total] = owner * width + within, kv[owner] + within, tab[owner]
    per_row[0, total:], per_row[2, total:] = 0, null_row
    inv = np.zeros((m, width), dtype=np.int64)
    inv[:n] = starts[:n, None] + np.minimum(np.arange(width)[None, :], k[:, None])
    per_req = np.zeros((2, m), dtype=np.int64)
    per_req[0], per_req[0, :n] = null_row, tab
    per_req[1, :n] = kv + k + 1
    return np.concatenate([per_row.ravel(), inv.ravel(), per_req.ravel(), starts])


def ragged_meta(
    block_tables: torch.Tensor, layout: torch.Tensor, width: int, m: int, rows: int, block_size: int
) -> tuple[torch.Tensor, SpanMeta]:
    """The device side of `ragged_layout` (graph-safe torch ops): (src [rows], (positions, slots, tables
    [m, max_blocks], seq_lens [m] int32, query_start_loc [m+1] int32), inv [m, width])."""
    src, pos, tab = layout[: 3 * rows].view(3, rows)
    inv = layout[3 * rows : 3 * rows + m * width].view(m, width)
    seq_tab, seq_lens = layout[3 * rows + m * width : 3 * rows + m * width + 2 * m].view(2, m)
    qsl = layout[3 * rows + m * width + 2 * m :]
    p = pos.clamp(min=0)
    slots = torch.where(pos >= 0, block_tables[tab, p // block_size].long() * block_size + p % block_size, -1)
    tables = block_tables.index_select(0, seq_tab)
    return src, (p, slots, tables, seq_lens.to(torch.int32), qsl.to(torch.int32)), inv
