"""Dense projections y = x @ W^T (weights stored [N, K] as in HF checkpoints): the references, the
skinny-M dispatch (tuned tables) and the wrappers; the Triton GEMM itself is in gemm.py."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.kernels import tuning
from engine.kernels._triton import cdiv, next_pow2
from engine.kernels.gemm import launch
from engine.kernels.split_sum import SplitSum
from engine.kernels.tuning import SkinnyConfig, TunedTables


def linear_ref(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """out: the [..., N] result's buffer (F.linear without a bias is this very matmul)."""
    return F.linear(x, weight) if out is None else torch.matmul(x, weight.t(), out=out)


def linear_batch_invariant_ref(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """One GEMM per row, so a row's result never depends on how many rows share the call."""
    if x.shape[0] == 0:
        return x.new_empty(0, weight.shape[0]) if out is None else out
    return torch.cat([F.linear(x[i : i + 1], weight) for i in range(x.shape[0])], out=out)


# --- Triton ---------------------------------------------------------------------------------
# At decode batch sizes a projection is pure weight streaming, which cuBLAS does at ~64% of copy
# bandwidth on an H200. The skinny kernel tiles N (and optionally K: split-K with a deterministic
# second pass) so that enough weight bytes are in flight; cuBLAS takes over above the tuned M range.
# Tuned configs per device live in engine/kernels/tuned/<device>.json (see tuning.py), read at the
# first launch on a device; a device without one uses default_skinny_config up to DEFAULT_M_MAX rows.

# Batch-invariant GEMM: one tiling for every M, no split-K.
INVARIANT_CONFIG = SkinnyConfig(block_m=32, block_n=64, block_k=64, split_k=1, num_warps=4, num_stages=3)
_TARGET_PROGRAMS = 264  # ~2 per SM on an H200 (132 SMs)


def default_skinny_config(m: int, n: int, k: int) -> SkinnyConfig:
    """Untuned fallback for shapes missing from the device's tuned table."""
    if m == 1:
        block_m, block_n, block_k = 1, 32, 256
    else:
        block_m, block_n, block_k = max(16, next_pow2(m)), 64, 128 if m <= 16 else 64
    tiles = cdiv(n, block_n) * cdiv(m, block_m)
    split_k = 1
    while split_k < 8 and tiles * split_k < _TARGET_PROGRAMS and k // (split_k * 2) >= 4 * block_k:
        split_k *= 2
    return SkinnyConfig(block_m, block_n, block_k, split_k, 4, 3)


def table_config(table, m: int, n: int, k: int, m_max: int) -> SkinnyConfig | None:
    """A tuned section's config for (m, n, k): a listed shape's M-bucket entry (None where the bucket
    is missing), else the default heuristic up to m_max rows."""
    per_m = table.get((n, k))
    if per_m is None:
        return default_skinny_config(m, n, k) if m <= m_max else None
    cfg = per_m.get(next_pow2(m))
    if cfg is None:
        return None
    return cfg if cfg.block_m != 1 or m == 1 else default_skinny_config(m, n, k)


def skinny_config(m: int, n: int, k: int, tables: TunedTables | None = None) -> SkinnyConfig | None:
    """The Triton config for an [m, k] x [n, k]^T projection, or None where cuBLAS is faster.
    A tuned shape uses its per-M-bucket entry (a missing bucket: cuBLAS); an untuned shape uses
    default_skinny_config up to `tables.m_max` rows."""
    t = tables or tuning.DEFAULT
    return table_config(t.linear, m, n, k, t.m_max)


def linear_with_config(
    x: torch.Tensor,
    weight: torch.Tensor,
    cfg: SkinnyConfig,
    defer: bool = False,
    out: torch.Tensor | None = None,
    tma: bool = True,
    defer_rows: int | None = None,
) -> torch.Tensor | SplitSum:
    """y = x @ W^T with an explicit Triton config; x: [M, K] unit-stride rows, W: [N, K] contiguous.
    defer: a one-row split-K y may come back as its partials (split_sum.SplitSum); defer_rows: up to
    that many rows instead. out: y's [M, N] buffer. tma: see gemm.launch."""
    assert x.shape[1] == weight.shape[1], (x.shape, weight.shape)
    return launch(x, weight, cfg, defer=defer, out=out, tma=tma, defer_rows=defer_rows)


def as_rows(x: torch.Tensor) -> torch.Tensor:
    """x as [rows, width] with unit-stride rows (a copy only where the view cannot give that)."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def _plain(weight: torch.Tensor) -> bool:
    return weight.stride(1) == 1 and weight.stride(0) == weight.shape[1]


def dispatch_config(config_for, x: torch.Tensor, weight: torch.Tensor, row_width: int) -> SkinnyConfig | None:
    """`config_for(m, n, k, tables)` for the m rows of `row_width` in x against the [n, k] weight, with
    the tables of x's device; None where the kernel does not serve the call (no rows, a config
    function that says so, or a weight that is not a contiguous [n, k] matrix)."""
    n, k = weight.shape
    m = x.numel() // row_width if row_width else 0
    cfg = config_for(m, n, k, tuning.tables_for(x.device)) if m else None
    return cfg if cfg is not None and _plain(weight) else None


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    defer: bool = False,
    out: torch.Tensor | None = None,
    defer_rows: int | None = None,
) -> torch.Tensor | SplitSum:
    """Triton skinny-M projection where it beats cuBLAS (see skinny_config), F.linear elsewhere.
    defer (Ops.linear_to_residual: a product only added to the residual stream): one split-K row of
    [M, K] rows comes back unsummed (split_sum.SplitSum), for the next add + RMSNorm prologue to sum;
    defer_rows: up to that many rows, for a consumer that sums any (rope.qk_norm_rope_store).
    out: a contiguous buffer of the result's shape, written and returned (never with defer)."""
    cfg = dispatch_config(skinny_config, x, weight, weight.shape[1])
    if cfg is None:
        return linear_ref(x, weight, out)
    rows = None if out is None else out.view(-1, weight.shape[0])
    defer = defer and x.dim() == 2 and out is None
    y = linear_with_config(as_rows(x), weight, cfg, defer=defer, out=rows, defer_rows=defer_rows)
    return y if isinstance(y, SplitSum) else y.view(*x.shape[:-1], weight.shape[0])


def linear_batch_invariant(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Batch-invariant Triton GEMM: fixed tiles and K order for every M, so row i is bit-identical
    whether the call has 1 or 64 rows. out: as linear's."""
    n = weight.shape[0]
    rows = None if out is None else out.view(-1, n)
    y = linear_with_config(as_rows(x), weight.contiguous(), INVARIANT_CONFIG, out=rows, tma=False)
    return y.view(*x.shape[:-1], n)
