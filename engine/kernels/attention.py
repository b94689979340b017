"""Paged attention over a block-table KV cache.

One entry point serves decode (one query row per sequence), prefill and verify spans
(causal within the span, over everything already cached) and the drafter's block
(non-causal: every block row sees every cached row of its sequence).
"""

from __future__ import annotations

import math

import torch

from engine.kernels._triton import cdiv, next_pow2, pdl
from engine.kernels.attention_kernels import paged_attn_kernel, paged_attn_reduce_kernel


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
    batch_invariant: each row alone over the keys up to its own position (causal), so its output is
    the same whatever the span, batch or sequence order around it.
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
        if batch_invariant:  # one row at a time over its own keys: a row's output is span-invariant
            for i in range(q_len):
                keys = seq_len - q_len + i + 1 if causal else seq_len
                probs = (torch.einsum("qhd,khd->hqk", qb[i : i + 1], k[:keys]) * scale).softmax(dim=-1)
                out[q_lo + i] = torch.einsum("hqk,khd->qhd", probs, v[:keys])[0].to(q.dtype)
            continue
        scores = torch.einsum("qhd,khd->hqk", qb, k) * scale
        if causal:
            key_pos = torch.arange(seq_len, device=q.device)
            q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)
            scores = scores.masked_fill(key_pos[None, None, :] > q_pos[None, :, None], float("-inf"))
        out[q_lo:q_hi] = torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), v).to(q.dtype)
    return out


# --- Triton ---------------------------------------------------------------------------------
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
# Decode with a grid already full without splits (high batch): the span tile (measured faster there)
DECODE_WIDE_BLOCK_N = 64
# Flash-decoding: split the keys of a sequence over programs when the grid would be small.
MAX_SPLITS = 32
SPLIT_TARGET_PROGRAMS_PER_SM = 2
# A split decode whose keys may exceed SPLIT_KEYS a split (max_kv) launches LONG_SPLIT_FACTOR x its
# splits; a sequence uses the extra ones only past SPLIT_KEYS keys a split (docs/design/kernels.md).
LONG_SPLIT_FACTOR = 2
SPLIT_KEYS = 512
# Software pipeline depth of the key and value tile loads (Triton's num_stages); SPLIT_STAGES for the
# flash-decoding splits of a decode of two or more sequences. On the H200 (decode_ab at 64973ba, 4B
# geometry) three stages there ran a step 1.017 at c=8 and 1.019 at c=16, and 0.994 at c=1 (so one
# sequence keeps NUM_STAGES); at c=64 (no splits, the wide tile) three stages for every launch ran 0.973,
# and one stage there 0.926 (decode_ab at 9850e40).
NUM_STAGES = 2
SPLIT_STAGES = 3


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
) -> tuple[int, int, int, int, int]:
    """(BLOCK_Q, BLOCK_M, BLOCK_N, NUM_SPLITS, MIN_SPLITS) from shapes and python ints only; max_kv
    bounds every sequence's keys (the block table's width). The grid has NUM_SPLITS splits, a sequence
    uses MIN_SPLITS of them up to SPLIT_KEYS keys a split and more beyond (attention_kernels._kv_range)."""
    if batch_invariant:
        block_m = max(INVARIANT_BLOCK_M, next_pow2(group))
        return max(1, block_m // group), block_m, INVARIANT_BLOCK_N, 1, 1
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
    if splits == 1 and span == 1:  # a full grid without splitting: wider key tiles, fewer loop trips
        block_n = DECODE_WIDE_BLOCK_N
    long = splits > 1 and span == 1 and max_kv > splits * SPLIT_KEYS
    grid = min(MAX_SPLITS, splits * LONG_SPLIT_FACTOR) if long else splits
    return block_q, block_m, block_n, grid, splits


def attention_stages(num_seqs: int, max_query_len: int, splits: int) -> int:
    """The attention kernel's num_stages: SPLIT_STAGES for a split decode of two or more sequences."""
    return SPLIT_STAGES if splits > 1 and max_query_len == 1 and num_seqs > 1 else NUM_STAGES


def early_lines(head_dim: int, k_cache: torch.Tensor, launch: dict) -> int:
    """128-byte lines in a cached row for the prefetch before the PDL wait (attention_kernels.py), or 0:
    none (PDL off, which the interpreter and pre-sm90 GPUs run)."""
    if not launch["PDL"]:
        return 0
    return max(1, head_dim * k_cache.element_size() // 128)


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
    block_q, block_m, block_n, splits, min_splits = attention_config(
        num_seqs, num_kv_heads, group, max_query_len, max_kv, q.device, batch_invariant
    )
    if num_splits is not None and not batch_invariant:
        splits = min_splits = num_splits
    if splits > 1:
        part_o = torch.empty(num_tokens * num_heads * splits, head_dim, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(num_tokens * num_heads * splits, dtype=torch.float32, device=q.device)
    else:
        part_o = part_lse = out
    grid = (num_seqs * num_kv_heads, cdiv(max_query_len, block_q), splits)
    launch = pdl(q.device, num_tokens)
    paged_attn_kernel[grid](
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
        MIN_SPLITS=min_splits,
        SPLIT_KEYS=SPLIT_KEYS,
        CAUSAL=causal,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        EARLY_LINES=early_lines(head_dim, k_cache, launch),
        num_warps=4,
        num_stages=attention_stages(num_seqs, max_query_len, splits),
        **launch,
    )
    if splits > 1:
        paged_attn_reduce_kernel[(num_tokens, num_heads)](
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
            **launch,
        )
    return out
