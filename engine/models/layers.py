"""The Qwen3 decoder layer on an `Ops` backend, shared by the target and the drafter."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from engine.kernels import Ops
from engine.kernels.split_sum import SplitSum
from engine.models.config import Geometry


@dataclass
class AttnMeta:
    """Where this step's rows go in the paged cache and what each query may see."""

    slot_mapping: torch.Tensor  # [T] int64, -1: do not write
    block_tables: torch.Tensor  # [B, max_blocks] int32
    seq_lens: torch.Tensor  # [B] int32, rows cached after this step
    query_start_loc: torch.Tensor  # [B+1] int32
    max_query_len: int
    causal: bool = True


def last_keys(meta: AttnMeta, keep: int, block_size: int) -> AttnMeta:
    """The same queries over each sequence's last `keep` keys only, or up to block_size - 1 more (whole
    KV blocks): its table from the block holding key seq_len - keep on. Keys carry their RoPE already, so
    only which keys are read changes; no write moves (slot_mapping stays)."""
    tables, width = meta.block_tables, meta.block_tables.shape[1]
    first = (meta.seq_lens - keep).clamp(min=0) // block_size
    columns = (first[:, None] + torch.arange(width, device=tables.device)).clamp(max=width - 1)
    lens = meta.seq_lens - (first * block_size).to(torch.int32)
    return replace(meta, block_tables=tables.gather(1, columns), seq_lens=lens)


@dataclass
class LayerWeights:
    input_norm: torch.Tensor
    qkv: torch.Tensor  # [q + 2 kv, H]
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    o: torch.Tensor
    post_norm: torch.Tensor
    gate_up: torch.Tensor  # [2 I, H]
    down: torch.Tensor

    @classmethod
    def take(cls, load: Callable[[str, tuple[int, ...]], torch.Tensor], prefix: str, g: Geometry) -> LayerWeights:
        """One layer's weights through `load(name, shape)` (loader.take bound to a checkpoint, device and
        dtype), projections fused (q|k|v, gate|up)."""
        h, d = g.hidden_size, g.head_dim

        def t(name: str, shape: tuple[int, ...]) -> torch.Tensor:
            return load(prefix + name, shape)

        return cls(
            input_norm=t("input_layernorm.weight", (h,)),
            qkv=torch.cat(
                [
                    t("self_attn.q_proj.weight", (g.q_size, h)),
                    t("self_attn.k_proj.weight", (g.kv_size, h)),
                    t("self_attn.v_proj.weight", (g.kv_size, h)),
                ]
            ),
            q_norm=t("self_attn.q_norm.weight", (d,)),
            k_norm=t("self_attn.k_norm.weight", (d,)),
            o=t("self_attn.o_proj.weight", (h, g.q_size)),
            post_norm=t("post_attention_layernorm.weight", (h,)),
            gate_up=torch.cat(
                [t("mlp.gate_proj.weight", (g.intermediate_size, h)), t("mlp.up_proj.weight", (g.intermediate_size, h))]
            ),
            down=t("mlp.down_proj.weight", (h, g.intermediate_size)),
        )


def heads(x: torch.Tensor | SplitSum, lo: int, hi: int, head_dim: int) -> torch.Tensor | SplitSum:
    """Columns lo:hi of a [rows, N] projection as [rows, heads, head_dim] views; of a SplitSum, the
    same views of each of its partials."""
    if isinstance(x, SplitSum):
        return SplitSum(x.parts[..., lo:hi].unflatten(-1, (-1, head_dim)), x.dtype)
    return x[:, lo:hi].unflatten(-1, (-1, head_dim))


def decoder_layer(
    ops: Ops,
    g: Geometry,
    w: LayerWeights,
    h: torch.Tensor,
    residual: torch.Tensor | None,
    positions: torch.Tensor,
    meta: AttnMeta,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cos_sin: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer; returns (mlp_out, residual). The layer's output (residual stream) is their sum:
    the add is deferred into the next layer's fused add+norm. mlp_out may be a split_sum.SplitSum
    (split_sum.dense sums it)."""
    eps = g.rms_norm_eps
    rows = h.shape[0]
    if residual is None:
        residual = h
        qkv = ops.linear(ops.rms_norm(h, w.input_norm, eps), w.qkv)
    else:  # the add + norm may run inside the projection (see kernels.md, add_rms_norm_linear)
        qkv, residual = ops.add_rms_norm_qkv(h, residual, w.input_norm, eps, w.qkv)
    q = heads(qkv, 0, g.q_size, g.head_dim)
    k = heads(qkv, g.q_size, g.q_size + g.kv_size, g.head_dim)
    v = heads(qkv, g.q_size + g.kv_size, g.q_size + 2 * g.kv_size, g.head_dim)
    q = ops.qk_norm_rope_store(
        q, k, v, positions, meta.slot_mapping, w.q_norm, w.k_norm, cos_sin, k_cache, v_cache, eps
    )
    o = ops.paged_attention(
        q,
        k_cache,
        v_cache,
        meta.block_tables,
        meta.seq_lens,
        meta.query_start_loc,
        meta.max_query_len,
        g.head_dim**-0.5,
        meta.causal,
    )
    h = ops.linear_to_residual(o.view(rows, g.q_size), w.o)
    # o and down may come back as unsummed split-K partials (docs/design/kernels.md, mlp_to_residual).
    return ops.mlp_to_residual(h, residual, w.post_norm, eps, w.gate_up, w.down)
