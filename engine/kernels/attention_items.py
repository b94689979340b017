"""Decode attention over several (sequence, kv head) items per program, for a decode whose grid is full
without splits (attention.py dispatches it where DECODE_ITEMS > 1).

At decode lengths a program of the one-item kernel runs 2-4 key tiles, and every program of the wave
waits for its first tile, computes and stores at the same time, so each item's first load and its
epilogue are exposed. Here a program walks its items' key tiles as one loop: the pipeliner loads the
next item's first tile while this item's last one computes, and an item's output is stored on its
last tile. The arithmetic per item is the one-item kernel's: the same tiles, in the same order, from
the same online-softmax state."""

from __future__ import annotations

from engine.kernels._triton import jit
from engine.kernels.attention_kernels import _pages

tl = None  # triton.language, bound by _triton.bind at the first launch


@jit
def paged_decode_items_kernel(
    q_ptr,
    k_cache,
    v_cache,
    bt_ptr,
    seq_lens_ptr,
    qsl_ptr,
    out_ptr,
    num_items,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_kb,
    stride_ko,
    stride_kh,
    stride_vb,
    stride_vo,
    stride_vh,
    stride_bt,
    qk_scale,
    HKV: tl.constexpr,
    G: tl.constexpr,
    D: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ITEMS: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    """Program p runs items p * ITEMS .. p * ITEMS + ITEMS - 1 (item = sequence * HKV + kv head), each
    sequence with at most one query (its row in query_start_loc; none: no tiles, nothing written)."""
    j_all = tl.arange(0, ITEMS)
    item0 = tl.program_id(0) * ITEMS
    seq = (item0 + j_all) // HKV
    ok = item0 + j_all < num_items
    # The bounds are step inputs the kernel before does not write: read before the wait.
    q_row = tl.load(qsl_ptr + seq, mask=ok, other=0)
    has_q = tl.load(qsl_ptr + seq + 1, mask=ok, other=0) > q_row
    lens = tl.where(has_q, tl.load(seq_lens_ptr + seq, mask=ok, other=0), 0)
    tiles = tl.cdiv(lens, BLOCK_N)
    ends = tl.cumsum(tiles, 0)
    if PDL:  # wait for the previous kernel's writes, then let the next kernel launch
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()

    m = tl.arange(0, BLOCK_M)
    row_ok = m < G
    d = tl.arange(0, D)
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)  # finite: fully masked rows stay NaN-free
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for t in range(0, tl.sum(tiles, 0)):
        j = tl.sum((ends <= t).to(tl.int32), 0)  # this tile's item
        mine = j_all == j
        first = tl.sum(tl.where(mine, ends - tiles, 0), 0)
        seq_len = tl.sum(tl.where(mine, lens, 0), 0)
        b = (item0 + j) // HKV
        kvh = (item0 + j) % HKV
        fresh = t == first  # a new item: a new online-softmax state
        m_i = tl.where(fresh, -1.0e30, m_i)
        l_i = tl.where(fresh, 0.0, l_i)
        acc = tl.where(fresh, 0.0, acc)
        row = tl.sum(tl.where(mine, q_row, 0), 0).to(tl.int64)
        h = kvh * G + m
        q = tl.load(q_ptr + row * stride_qt + h[:, None] * stride_qh + d[None, :], mask=row_ok[:, None], other=0.0)
        n = (t - first) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = n < seq_len
        blk, off = _pages(bt_ptr + b.to(tl.int64) * stride_bt, n, n_ok, PAGE)
        k = tl.load(
            k_cache + blk[:, None] * stride_kb + off[:, None] * stride_ko + kvh * stride_kh + d[None, :],
            mask=n_ok[:, None],
            other=0.0,
        )
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        s = tl.where(n_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(
            v_cache + blk[:, None] * stride_vb + off[:, None] * stride_vo + kvh * stride_vh + d[None, :],
            mask=n_ok[:, None],
            other=0.0,
        )
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
        o = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
        last = (t - first + 1) * BLOCK_N >= seq_len
        dst = out_ptr + row * stride_ot + h[:, None] * stride_oh + d[None, :]
        tl.store(dst, o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & last)
