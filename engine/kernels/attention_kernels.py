"""The Triton kernels of paged attention (attention.py holds the reference, the configs and the
wrapper): the tiled online-softmax kernel and the reduce that combines flash-decoding splits.

With EARLY_LINES > 0 the attention program pulls its first key tile's K and V rows into L2 before
its PDL wait. Rows below the span's first query were cached by earlier launches, and the kernel
before this one (QK-norm + RoPE + store) writes only the span's own rows; the bounds it reads
there (seq_lens, query_start_loc, the block table) were written before that kernel started. So
under PDL the tile streams while the kernel before drains, and the first loop trip reads it from
L2. The prefetch is a hint. The bounds, read before the wait, are the ones the kernel computes with
(the kernel before writes none of them); the splits' reduce reads its row count so too."""

from __future__ import annotations

from engine.kernels._triton import jit

tl = None  # triton.language, bound by _triton.bind at the first launch


@jit
def paged_attn_kernel(
    q_ptr,
    k_cache,
    v_cache,
    bt_ptr,
    seq_lens_ptr,
    qsl_ptr,
    out_ptr,
    part_o_ptr,
    part_lse_ptr,
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
    HQ: tl.constexpr,
    G: tl.constexpr,
    D: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    MIN_SPLITS: tl.constexpr,
    SPLIT_KEYS: tl.constexpr,
    CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr,
    EARLY_LINES: tl.constexpr,
    PDL: tl.constexpr,
):
    pid = tl.program_id(0)
    b = pid // HKV
    kvh = pid % HKV
    q_tile = tl.program_id(1) * BLOCK_Q
    split = tl.program_id(2)
    bt_row = bt_ptr + b.to(tl.int64) * stride_bt
    q_start = tl.load(qsl_ptr + b)  # before the wait (module docstring)
    q_len = tl.load(qsl_ptr + b + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + b)
    lo, hi = _kv_range(seq_len, q_len, q_tile, split, BLOCK_Q, BLOCK_N, NUM_SPLITS, MIN_SPLITS, SPLIT_KEYS, CAUSAL)
    if EARLY_LINES > 0:  # the first tile's cached rows into L2
        n = lo + tl.arange(0, BLOCK_N)
        blk, off = _pages(bt_row, n, (n < tl.minimum(hi, seq_len - q_len)) & (q_tile < q_len), PAGE)
        line = tl.arange(0, EARLY_LINES)[None, :] * (D // EARLY_LINES)  # 128 bytes apart
        _prefetch_l2(k_cache + blk[:, None] * stride_kb + off[:, None] * stride_ko + kvh * stride_kh + line)
        _prefetch_l2(v_cache + blk[:, None] * stride_vb + off[:, None] * stride_vo + kvh * stride_vh + line)
    m = tl.arange(0, BLOCK_M)
    qi = q_tile + m // G
    row_ok = (m < BLOCK_Q * G) & (qi < q_len)
    t = (q_start + qi).to(tl.int64)
    h = kvh * G + m % G
    if NUM_SPLITS > 1:  # noqa: SIM102 (a constexpr test around a runtime one: Triton keeps them apart)
        # An unused split writes its empty lse and leaves before the wait, holding no slot: the buffer's
        # last reader (an earlier layer's reduce) is two or more kernels back, done before this launch.
        if lo >= hi:
            tl.store(part_lse_ptr + (t * HQ + h) * NUM_SPLITS + split, float("-inf"), mask=row_ok)
            return
    if PDL:  # wait for the previous kernel's writes, then let the next kernel launch
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    if q_tile >= q_len:
        return
    ctx = seq_len - q_len  # position of the span's first query
    d = tl.arange(0, D)
    q = tl.load(q_ptr + t[:, None] * stride_qt + h[:, None] * stride_qh + d[None, :], mask=row_ok[:, None], other=0.0)
    q_pos = ctx + qi

    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)  # finite: fully masked rows stay NaN-free
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        n_ok = n < hi
        blk, off = _pages(bt_row, n, n_ok, PAGE)
        k = tl.load(
            k_cache + blk[:, None] * stride_kb + off[:, None] * stride_ko + kvh * stride_kh + d[None, :],
            mask=n_ok[:, None],
            other=0.0,
        )
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        ok = n_ok[None, :]
        if CAUSAL:
            ok = ok & (n[None, :] <= q_pos[:, None])
        s = tl.where(ok, s, float("-inf"))
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

    has = l_i > 0.0
    o = acc / tl.where(has, l_i, 1.0)[:, None]
    if NUM_SPLITS == 1:
        dst = out_ptr + t[:, None] * stride_ot + h[:, None] * stride_oh + d[None, :]
        tl.store(dst, o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
    else:
        part = (t * HQ + h) * NUM_SPLITS + split
        tl.store(part_o_ptr + part[:, None] * D + d[None, :], o, mask=row_ok[:, None])
        lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
        tl.store(part_lse_ptr + part, lse, mask=row_ok)


@jit
def _kv_range(
    seq_len,
    q_len,
    q_tile,
    split,
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    MIN_SPLITS: tl.constexpr,
    SPLIT_KEYS: tl.constexpr,
    CAUSAL: tl.constexpr,
):
    """This program's key rows [lo, hi). A sequence uses MIN_SPLITS of the NUM_SPLITS splits, more (up to
    all) once its keys exceed SPLIT_KEYS a split: the grid is fixed (graph-safe), the work follows the
    context read here; an unused split writes only its lse (-inf), its partial is never read."""
    kv_end = seq_len
    if CAUSAL:  # the tile's last query bounds the keys
        kv_end = seq_len - q_len + tl.minimum(q_tile + BLOCK_Q, q_len)
    if NUM_SPLITS == 1:
        lo = 0
        hi = kv_end
    else:
        # Splits share this sequence's actual keys (read here, not on the host) in whole tiles.
        used = tl.minimum(tl.maximum(tl.cdiv(kv_end, SPLIT_KEYS), MIN_SPLITS), NUM_SPLITS)
        chunk = tl.cdiv(tl.cdiv(kv_end, used), BLOCK_N) * BLOCK_N
        lo = split * chunk
        hi = tl.minimum(lo + chunk, kv_end)
    return lo, hi


@jit
def _pages(bt_row, n, ok, PAGE: tl.constexpr):
    """(block, offset in it) of key rows n; rows not ok get block 0, an address inside the cache."""
    return tl.load(bt_row + n // PAGE, mask=ok, other=0).to(tl.int64), n % PAGE


@jit
def _prefetch_l2(ptrs):
    """Pull the lines at ptrs into L2 without waiting for them (nothing comes back)."""
    tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1
    )


@jit
def paged_attn_reduce_kernel(
    part_o_ptr,
    part_lse_ptr,
    out_ptr,
    qsl_ptr,
    num_seqs,
    stride_ot,
    stride_oh,
    HQ: tl.constexpr,
    D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    PDL: tl.constexpr,
):
    rows = tl.load(qsl_ptr + num_seqs)  # a step input, read before the wait as the attention reads its bounds
    if PDL:  # wait for the previous kernel's writes, then let the next kernel launch
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    if t >= rows:  # rows past the last span were never written
        return
    s = tl.arange(0, NUM_SPLITS)
    d = tl.arange(0, D)
    part = (t * HQ + h) * NUM_SPLITS + s
    lse = tl.load(part_lse_ptr + part)
    mx = tl.max(lse, axis=0)
    w = tl.exp2(lse - mx)  # empty splits: exp2(-inf) = 0
    o = tl.load(part_o_ptr + part[:, None] * D + d[None, :], mask=(lse > float("-inf"))[:, None], other=0.0)
    o = tl.sum(w[:, None] * o, axis=0) / tl.sum(w, axis=0)
    tl.store(out_ptr + t * stride_ot + h * stride_oh + d, o.to(out_ptr.dtype.element_ty))
