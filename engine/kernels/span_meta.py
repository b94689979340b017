"""A uniform span step's attention metadata from its staged per-request inputs, on the device (CUDA-graph
safe): request i's S rows sit at positions num_kv[i] .. num_kv[i] + S - 1, their KV slots come from
its block-table row rows[i], and it has num_kv[i] + S rows cached after the step. The reference is a
chain of torch ops, about ten kernels inside a captured step; the Triton kernel is one launch."""

from __future__ import annotations

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
