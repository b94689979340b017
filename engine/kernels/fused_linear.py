"""Fused projections: the MLP's SwiGLU + down (`silu_mul_linear`) and a residual add + RMSNorm folded
into the projection that consumes it (`add_rms_norm_linear`).

Both run gemm.py's Triton GEMM with a prologue (`SWIGLU` / `NORM`), which forms each K tile of the
activation in registers; the kernel and its prologue helpers live in gemm.py (see there why)."""

from __future__ import annotations

import torch

from engine.kernels import tuning
from engine.kernels.activation import silu_and_mul, silu_and_mul_ref
from engine.kernels.gemm import launch
from engine.kernels.linear import (
    as_rows,
    dispatch_config,
    linear,
    linear_batch_invariant,
    linear_batch_invariant_ref,
    linear_ref,
    skinny_config,
    table_config,
)
from engine.kernels.norm import add_rms_norm, add_rms_norm_ref
from engine.kernels.split_sum import SplitSum
from engine.kernels.tuning import SkinnyConfig, TunedTables

# Rows up to which a split-K q|k|v hands its partials to QK-norm + RoPE + store (add_rms_norm_qkv)
# instead of a reduce launch; 0: the reduce (the A/B's before). Only a tuned entry with split_k > 1 splits.
QKV_DEFER_MAX_ROWS = 64


def silu_mul_linear_ref(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """down(silu(gate) * up): x [.., 2I] = [gate | up], weight [N, I]."""
    return linear_ref(silu_and_mul_ref(x), weight)


def silu_mul_linear_batch_invariant_ref(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return linear_batch_invariant_ref(silu_and_mul_ref(x), weight)


def add_rms_norm_linear_ref(
    x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(linear(rms_norm(x + residual)), x + residual): a residual add + RMSNorm and the projection
    that consumes the normalised rows."""
    normed, summed = add_rms_norm_ref(x, residual, norm_weight, eps)
    return linear_ref(normed, weight), summed


def add_rms_norm_linear_batch_invariant_ref(
    x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    normed, summed = add_rms_norm_ref(x, residual, norm_weight, eps)
    return linear_batch_invariant_ref(normed, weight), summed


# --- Triton ---------------------------------------------------------------------------------


def add_rms_norm_linear_config(m: int, n: int, k: int, tables: TunedTables | None = None) -> SkinnyConfig | None:
    """The fused add + RMSNorm + projection config, or None where add_rms_norm + `linear` serve. A
    shape listed in the table's add_rms_norm_linear section uses its buckets; any other runs fused at
    the projection's own skinny config up to `norm_m_max` rows (1 by default: the GEMV). Never a
    split-K config: the one-pass prologue needs whole rows."""
    t = tables or tuning.DEFAULT
    if (n, k) in t.add_rms_norm_linear:
        cfg = table_config(t.add_rms_norm_linear, m, n, k, 0)
    else:
        cfg = skinny_config(m, n, k, t) if m <= t.norm_m_max else None
    return cfg if cfg is not None and cfg.split_k == 1 else None


def silu_mul_linear_config(m: int, n: int, inter: int, tables: TunedTables | None = None) -> SkinnyConfig | None:
    """The fused SwiGLU + down config for [m, 2 inter] x [n, inter]^T, or None where the unfused
    pair (silu_and_mul, then `linear`) serves. A shape tuned for the fused kernel uses its entries;
    otherwise the fused kernel runs at the down projection's own skinny config, up to
    `tables.fused_m_max` rows."""
    t = tables or tuning.DEFAULT
    if (n, inter) in t.silu_mul_linear:
        return table_config(t.silu_mul_linear, m, n, inter, 0)
    return skinny_config(m, n, inter, t) if m <= t.fused_m_max else None


def silu_mul_linear_with_config(
    x: torch.Tensor, weight: torch.Tensor, cfg: SkinnyConfig, defer: bool = False
) -> torch.Tensor | SplitSum:
    """(silu(gate) * up) @ W^T with an explicit config; x: [M, 2I] = [gate | up] unit-stride rows,
    W: [N, I] contiguous. The [M, I] activation is never written. defer: as linear_with_config."""
    assert x.shape[1] == 2 * weight.shape[1], (x.shape, weight.shape)
    return launch(x, weight, cfg, swiglu=True, defer=defer)


def add_rms_norm_linear_with_config(
    x: torch.Tensor | SplitSum,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    cfg: SkinnyConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual) * norm_weight @ W^T, x + residual) in one launch (+ the split-K
    reduce) with an explicit config; x, residual: [M, K] unit-stride rows, every tensor one dtype (x
    may be a SplitSum of that dtype)."""
    assert x.shape == residual.shape and x.shape[1] == weight.shape[1] == norm_weight.shape[0], (x.shape, weight.shape)
    assert len({x.dtype, residual.dtype, norm_weight.dtype, weight.dtype}) == 1 and norm_weight.stride(0) == 1
    if cfg.split_k != 1:
        raise ValueError(f"the add + RMSNorm prologue needs whole rows: split_k 1, got {cfg}")
    summed = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    return launch(x, weight, cfg, norm=(residual, norm_weight, summed, float(eps))), summed


def silu_mul_linear(x: torch.Tensor, weight: torch.Tensor, defer: bool = False) -> torch.Tensor | SplitSum:
    """Triton `silu_mul_linear_ref`: the fused kernel where silu_mul_linear_config has a config
    (skinny M), else silu_and_mul + `linear` (which may be cuBLAS). defer: as `linear`'s."""
    n, inter = weight.shape
    cfg = dispatch_config(silu_mul_linear_config, x, weight, 2 * inter)
    if cfg is None or x.shape[-1] != 2 * inter:
        return linear(silu_and_mul(x), weight, defer=defer)
    y = silu_mul_linear_with_config(as_rows(x), weight, cfg, defer=defer and x.dim() == 2)
    return y if isinstance(y, SplitSum) else y.view(*x.shape[:-1], n)


def silu_mul_linear_batch_invariant(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Batch-invariant mode: silu_and_mul (per row) + the fixed-tile GEMM."""
    return linear_batch_invariant(silu_and_mul(x), weight)


def add_rms_norm_linear(
    x: torch.Tensor | SplitSum,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    defer_rows: int = 0,
) -> tuple[torch.Tensor | SplitSum, torch.Tensor]:
    """Triton `add_rms_norm_linear_ref`: the NORM-prologue kernel where add_rms_norm_linear_config
    has a config, else add_rms_norm + `linear`. x may be a SplitSum (from the `_to_residual`
    projections): the prologue sums it where it runs on the early-weights GEMV. defer_rows: a split-K
    product of up to that many rows comes back as its partials (SplitSum), unsummed."""
    n, k = weight.shape
    cfg = dispatch_config(add_rms_norm_linear_config, residual, weight, k)
    if (
        cfg is None
        or x.shape != residual.shape
        or x.shape[-1] != k
        or len({x.dtype, residual.dtype, norm_weight.dtype, weight.dtype}) != 1
        or norm_weight.stride(-1) != 1
    ):
        normed, summed = add_rms_norm(x, residual, norm_weight, eps)
        return linear(normed, weight, defer=defer_rows > 0, defer_rows=defer_rows), summed
    rows = x if isinstance(x, SplitSum) else as_rows(x)
    y, summed = add_rms_norm_linear_with_config(rows, as_rows(residual), norm_weight, eps, weight, cfg)
    return y.view(*x.shape[:-1], n), summed.view(x.shape)


def add_rms_norm_qkv(
    x: torch.Tensor | SplitSum, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor
) -> tuple[torch.Tensor | SplitSum, torch.Tensor]:
    """add_rms_norm_linear for q|k|v: its consumer (rope.qk_norm_rope_store) sums split-K partials
    itself, so up to QKV_DEFER_MAX_ROWS rows a split-K q|k|v launches no reduce."""
    return add_rms_norm_linear(x, residual, norm_weight, eps, weight, defer_rows=QKV_DEFER_MAX_ROWS)


def add_rms_norm_linear_batch_invariant(
    x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch-invariant mode: add_rms_norm (per row) + the fixed-tile GEMM."""
    normed, summed = add_rms_norm(x, residual, norm_weight, eps)
    return linear_batch_invariant(normed, weight), summed
