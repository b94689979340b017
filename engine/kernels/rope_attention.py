"""QK-norm + RoPE + KV store, then paged attention: the attention half of a decoder layer.

The Triton form runs both in one launch where every sequence brings one query (decode, the gated
round): each attention program norms and rotates its q heads itself, skips the new row in its key
loop (not stored yet), and the program whose keys hold it adds it from registers as one more
online-softmax step; split 0 stores it. Spans (verify, prefill, the drafter's block) keep the two
launches: their keys attend to each other; so does batch-invariant mode, whose decode row must round
as the same row of a span does (the new row's score is a sum here, a tile's tl.dot there).
"""

from __future__ import annotations

import torch

from engine.kernels.attention import NewKV, paged_attention, paged_attention_ref
from engine.kernels.rope import qk_norm_rope_store, qk_norm_rope_store_ref

FUSE_DECODE = True  # kernel_ab / decode_ab switch it off for the "before" arm


def qk_norm_rope_attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    q_norm_weight: torch.Tensor,
    k_norm_weight: torch.Tensor,
    cos_sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    eps: float,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    max_query_len: int,
    scale: float,
    causal: bool = True,
    batch_invariant: bool = False,
) -> torch.Tensor:
    """q: [T, Hq, D], k, v: [T, Hkv, D] raw from the projection; the other arguments as in
    `qk_norm_rope_store_ref` and `paged_attention_ref`. Returns the attention output [T, Hq, D]."""
    q = qk_norm_rope_store_ref(
        q, k, v, positions, slot_mapping, q_norm_weight, k_norm_weight, cos_sin, k_cache, v_cache, eps
    )
    return paged_attention_ref(
        q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, max_query_len, scale, causal, batch_invariant
    )


def qk_norm_rope_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    q_norm_weight: torch.Tensor,
    k_norm_weight: torch.Tensor,
    cos_sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    eps: float,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    max_query_len: int,
    scale: float,
    causal: bool = True,
    batch_invariant: bool = False,
) -> torch.Tensor:
    """Triton `qk_norm_rope_attention_ref`: one launch (plus the split reduce) at max_query_len 1."""
    attend = lambda q, new_kv=None: paged_attention(  # noqa: E731
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        max_query_len,
        scale,
        causal,
        batch_invariant,
        new_kv=new_kv,
    )
    if FUSE_DECODE and max_query_len == 1 and not batch_invariant and q_norm_weight.dtype == q.dtype:
        return attend(q, NewKV(k, v, positions, slot_mapping, q_norm_weight, k_norm_weight, cos_sin, eps))
    q = qk_norm_rope_store(
        q, k, v, positions, slot_mapping, q_norm_weight, k_norm_weight, cos_sin, k_cache, v_cache, eps
    )
    return attend(q)
