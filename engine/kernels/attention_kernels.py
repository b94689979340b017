"""The Triton kernels of paged attention (attention.py holds the reference, the configs and the
wrapper): the tiled online-softmax kernel and the reduce that combines flash-decoding splits."""

from __future__ import annotations

from engine.kernels._triton import jit
from engine.kernels.rope import _norm_rope_heads

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
    nk_ptr,
    nv_ptr,
    pos_ptr,
    slot_ptr,
    qw_ptr,
    kw_ptr,
    cs_ptr,
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
    stride_nkt,
    stride_nkh,
    stride_nvt,
    stride_nvh,
    stride_cs,
    eps,
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
    CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr,
    NEW_KV: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:  # wait for the previous kernel's writes, then let the next kernel launch
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    pid = tl.program_id(0)
    b = pid // HKV
    kvh = pid % HKV
    q_tile = tl.program_id(1) * BLOCK_Q
    split = tl.program_id(2)
    q_start = tl.load(qsl_ptr + b)
    q_len = tl.load(qsl_ptr + b + 1) - q_start
    if q_tile >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + b)
    ctx = seq_len - q_len  # position of the span's first query

    m = tl.arange(0, BLOCK_M)
    qi = q_tile + m // G
    row_ok = (m < BLOCK_Q * G) & (qi < q_len)
    t = (q_start + qi).to(tl.int64)
    h = kvh * G + m % G
    d = tl.arange(0, D)
    if NEW_KV:  # one query per sequence, raw from q|k|v: QK-norm + RoPE here; the new key after the loop
        row = q_start.to(tl.int64)
        pos = tl.load(pos_ptr + row).to(tl.int64)
        cs = cs_ptr + pos * stride_cs + d % (D // 2)
        q_ty = q_ptr.dtype.element_ty
        q = _norm_rope_heads(
            q_ptr + row * stride_qt,
            stride_qh,
            h,
            row_ok,
            qw_ptr,
            tl.load(cs)[None, :],
            tl.load(cs + D // 2)[None, :],
            eps,
            q_ty,
            D,
        )
        slot = tl.load(slot_ptr + row).to(tl.int64)
        new_at = tl.where(slot >= 0, pos, -1)  # a row not stored reads the cache there, as the reference does
    else:
        q = tl.load(
            q_ptr + t[:, None] * stride_qt + h[:, None] * stride_qh + d[None, :], mask=row_ok[:, None], other=0.0
        )
    q_pos = ctx + qi

    kv_end = seq_len
    if CAUSAL:  # the tile's last query bounds the keys
        kv_end = ctx + tl.minimum(q_tile + BLOCK_Q, q_len)
    if NUM_SPLITS == 1:
        lo = 0
        hi = kv_end
    else:
        # Splits share this sequence's actual keys (read here, not on the host) in whole tiles.
        chunk = tl.cdiv(tl.cdiv(kv_end, NUM_SPLITS), BLOCK_N) * BLOCK_N
        lo = split * chunk
        hi = tl.minimum(lo + chunk, kv_end)

    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)  # finite: fully masked rows stay NaN-free
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    bt_row = bt_ptr + b.to(tl.int64) * stride_bt
    for start in range(lo, hi, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        n_ok = n < hi
        blk = tl.load(bt_row + n // PAGE, mask=n_ok, other=0).to(tl.int64)
        off = n % PAGE
        if NEW_KV:  # the new row is not read here (its cache row is not written yet): it joins after the loop
            n_ok = n_ok & (n != new_at)
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

    if NEW_KV:  # noqa: SIM102 (a constexpr branch: `slot`, `pos` and `new_at` exist only under it)
        # Formed here, not before the loop: live through it, the new row's registers cost the key loop
        # its occupancy (the H200 at batch 64: 1.3-1.5x the two launches).
        holds = (new_at >= lo) & (new_at < hi)  # this program's keys hold the new row
        stores = (split == 0) & (slot >= 0)  # one program stores it, once done: every program read registers
        if holds | stores:
            one = kvh + tl.arange(0, 1)
            cos, sin = tl.load(cs)[None, :], tl.load(cs + D // 2)[None, :]
            k_ty = k_cache.dtype.element_ty
            k_new = _norm_rope_heads(
                nk_ptr + row * stride_nkt, stride_nkh, one, one < HKV, kw_ptr, cos, sin, eps, k_ty, D
            )
            v_new = tl.load(nv_ptr + row * stride_nvt + kvh * stride_nvh + d[None, :]).to(v_cache.dtype.element_ty)
            if holds:  # one more online-softmax step; no causal mask: a held key is < seq_len, the query at seq_len - 1
                s_new = tl.sum(q.to(tl.float32) * k_new.to(tl.float32), axis=1) * qk_scale
                m_new = tl.maximum(m_i, s_new)
                alpha = tl.exp2(m_i - m_new)
                p_new = tl.exp2(s_new - m_new)
                l_i = l_i * alpha + p_new
                acc = acc * alpha[:, None] + p_new[:, None] * v_new.to(tl.float32)
                m_i = m_new
            if stores:
                dst = (slot // PAGE) * stride_kb + (slot % PAGE) * stride_ko + kvh * stride_kh + d[None, :]
                tl.store(k_cache + dst, k_new)
                vdst = (slot // PAGE) * stride_vb + (slot % PAGE) * stride_vo + kvh * stride_vh + d[None, :]
                tl.store(v_cache + vdst, v_new)
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
    if PDL:  # wait for the previous kernel's writes, then let the next kernel launch
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    if t >= tl.load(qsl_ptr + num_seqs):  # rows past the last span were never written
        return
    s = tl.arange(0, NUM_SPLITS)
    d = tl.arange(0, D)
    part = (t * HQ + h) * NUM_SPLITS + s
    lse = tl.load(part_lse_ptr + part)
    mx = tl.max(lse, axis=0)
    w = tl.exp2(lse - mx)  # empty splits: exp2(-inf) = 0
    o = tl.load(part_o_ptr + part[:, None] * D + d[None, :])
    o = tl.sum(w[:, None] * o, axis=0) / tl.sum(w, axis=0)
    tl.store(out_ptr + t * stride_ot + h * stride_oh + d, o.to(out_ptr.dtype.element_ty))
