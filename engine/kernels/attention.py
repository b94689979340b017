"""Paged attention over a block-table KV cache.

One entry point serves decode (one query row per sequence), prefill and verify spans
(causal within the span, over everything already cached) and the drafter's block
(non-causal: every block row sees every cached row of its sequence).
"""
from __future__ import annotations

import torch


def gather_kv_ref(
    cache: torch.Tensor, block_table: torch.Tensor, seq_len: int
) -> torch.Tensor:
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
