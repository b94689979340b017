"""Paged attention over a block-table KV cache.

One entry point serves decode (one query row per sequence), prefill and verify spans
(causal within the span, over everything already cached) and the drafter's block
(non-causal: every block row sees every cached row of its sequence).
"""

from __future__ import annotations

import math

import torch

from engine.kernels._triton import cdiv, jit, next_pow2


def gather_kv_ref(cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Rows 0..seq_len-1 of one sequence from a [num_blocks, block_size, Hkv, D] cache."""
    block_size = cache.shape[1]
    pos = torch.arange(seq_len, device=cache.device)
    blocks = block_table.long()[pos // block_size]
    return cache[blocks, pos % block_size]


def paged_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    max_query_len: int,
    scale: float,
    causal: bool = True,
    batch_invariant: bool = False,
) -> torch.Tensor:
    """q: [T, Hq, D]; block_tables: [B, max_blocks]; seq_lens: [B] (cached rows incl. this step's);
    query_start_loc: [B+1]. Query i of a span of length L sits at position seq_len - L + i.
    Returns [T, Hq, D] in q's dtype. max_query_len is a launch hint for kernels; unused here.
    """
    del max_query_len
    out = torch.empty_like(q)
    num_heads = q.shape[1]
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    starts = query_start_loc.tolist()
    for b, seq_len in enumerate(seq_lens.tolist()):
        q_lo, q_hi = starts[b], starts[b + 1]
        q_len = q_hi - q_lo
        if q_len == 0:
            continue
        k = gather_kv_ref(k_cache, block_tables[b], seq_len).float().repeat_interleave(group, dim=1)
        v = gather_kv_ref(v_cache, block_tables[b], seq_len).float().repeat_interleave(group, dim=1)
        qb = q[q_lo:q_hi].float()
        key_pos = torch.arange(seq_len, device=q.device)
        q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)
        rows = [slice(i, i + 1) for i in range(q_len)] if batch_invariant else [slice(0, q_len)]
        for r in rows:
            scores = torch.einsum("qhd,khd->hqk", qb[r], k) * scale
            if causal:
                scores = scores.masked_fill(key_pos[None, None, :] > q_pos[r][None, :, None], float("-inf"))
            probs = scores.softmax(dim=-1)
            out[q_lo + r.start : q_lo + r.stop] = torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)
    return out


# --- Triton ---------------------------------------------------------------------------------
tl = None  # triton.language, bound by _triton.bind at the first launch
# One program = one (sequence, kv head, tile of BLOCK_Q queries, KV split). Its BLOCK_M rows are
# the BLOCK_Q queries x the G q heads sharing the kv head, so K/V tiles are loaded once per group
# and scores come from tl.dot (BLOCK_M >= 16). All bounds are read from seq_lens/query_start_loc
# inside the kernel; the grid depends on shapes and max_query_len only (CUDA-graph safe).

# Batch-invariant mode: one config for every call, whatever the batch or span.
INVARIANT_BLOCK_M = 16
INVARIANT_BLOCK_N = 32
# Default tiles: key tile for decode (span 1) and for spans; rows (queries x group) per program.
DECODE_BLOCK_N = 32
SPAN_BLOCK_N = 64
MAX_BLOCK_M = 64
# Flash-decoding: split the keys of a sequence over programs when the grid would be small.
MAX_SPLITS = 32
SPLIT_TARGET_PROGRAMS_PER_SM = 2


@jit
def _paged_attn_kernel(
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
    CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr,
):
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
    q = tl.load(q_ptr + t[:, None] * stride_qt + h[:, None] * stride_qh + d[None, :], mask=row_ok[:, None], other=0.0)
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
def _paged_attn_reduce_kernel(
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
):
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


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # interpreter: small, so tests exercise the split path


def attention_config(
    num_seqs: int,
    num_kv_heads: int,
    group: int,
    max_query_len: int,
    max_kv: int,
    device: torch.device,
    batch_invariant: bool,
) -> tuple[int, int, int, int]:
    """(BLOCK_Q, BLOCK_M, BLOCK_N, NUM_SPLITS) from shapes and python ints only."""
    if batch_invariant:
        block_m = max(INVARIANT_BLOCK_M, next_pow2(group))
        return max(1, block_m // group), block_m, INVARIANT_BLOCK_N, 1
    span = max(1, max_query_len)
    block_m = max(16, min(MAX_BLOCK_M, next_pow2(span * group)))
    block_q = max(1, block_m // group)
    block_m = max(16, next_pow2(block_q * group))
    block_n = SPAN_BLOCK_N if span > 1 else DECODE_BLOCK_N
    programs = num_seqs * num_kv_heads * cdiv(span, block_q)
    splits = 1
    target = SPLIT_TARGET_PROGRAMS_PER_SM * _num_sms(device)
    while splits < MAX_SPLITS and programs * splits * 2 <= target and splits * block_n * 2 <= max_kv:
        splits *= 2
    return block_q, block_m, block_n, splits


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    max_query_len: int,
    scale: float,
    causal: bool = True,
    batch_invariant: bool = False,
    num_splits: int | None = None,
) -> torch.Tensor:
    """Triton `paged_attention_ref`. `num_splits` (power of two) overrides the split heuristic."""
    num_tokens, num_heads, head_dim = q.shape
    _, page, num_kv_heads, _ = k_cache.shape
    num_seqs = seq_lens.shape[0]
    group = num_heads // num_kv_heads
    assert head_dim == next_pow2(head_dim) and head_dim >= 16, "head_dim must be a power of two >= 16"
    assert q.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if num_tokens == 0 or num_seqs == 0 or max_query_len <= 0:
        return out
    max_kv = block_tables.shape[1] * page
    block_q, block_m, block_n, splits = attention_config(
        num_seqs, num_kv_heads, group, max_query_len, max_kv, q.device, batch_invariant
    )
    if num_splits is not None and not batch_invariant:
        splits = num_splits
    if splits > 1:
        part_o = torch.empty(num_tokens * num_heads * splits, head_dim, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(num_tokens * num_heads * splits, dtype=torch.float32, device=q.device)
    else:
        part_o = part_lse = out
    grid = (num_seqs * num_kv_heads, cdiv(max_query_len, block_q), splits)
    _paged_attn_kernel[grid](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        out,
        part_o,
        part_lse,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        block_tables.stride(0),
        scale * math.log2(math.e),
        HKV=num_kv_heads,
        HQ=num_heads,
        G=group,
        D=head_dim,
        PAGE=page,
        BLOCK_Q=block_q,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        NUM_SPLITS=splits,
        CAUSAL=causal,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=4,
        num_stages=2,
    )
    if splits > 1:
        _paged_attn_reduce_kernel[(num_tokens, num_heads)](
            part_o,
            part_lse,
            out,
            query_start_loc,
            num_seqs,
            out.stride(0),
            out.stride(1),
            HQ=num_heads,
            D=head_dim,
            NUM_SPLITS=splits,
            num_warps=4,
        )
    return out
