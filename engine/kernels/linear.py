"""Dense projections y = x @ W^T (weights stored [N, K] as in HF checkpoints).

The one Triton GEMM here also runs the fused projections of fused_linear.py: its SWIGLU and NORM
prologues (and their jit helpers) stay in this module because the lazy triton binding resolves a
kernel's helpers in the kernel's own module."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.kernels import tuning
from engine.kernels._triton import cdiv, jit, next_pow2
from engine.kernels.tuning import SkinnyConfig, TunedTables


def linear_ref(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.linear(x, weight)


def linear_batch_invariant_ref(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """One GEMM per row, so a row's result never depends on how many rows share the call."""
    if x.shape[0] == 0:
        return x.new_empty(0, weight.shape[0])
    return torch.cat([F.linear(x[i : i + 1], weight) for i in range(x.shape[0])])


# --- Triton ---------------------------------------------------------------------------------
tl = None  # triton.language, bound by _triton.bind at the first launch
# At decode batch sizes a projection is pure weight streaming, which cuBLAS does at ~64% of copy
# bandwidth on an H200. The skinny kernel tiles N (and optionally K: split-K with a deterministic
# second pass) so that enough weight bytes are in flight; cuBLAS takes over above the tuned M range.
# Tuned configs per device live in engine/kernels/tuned/<device>.json (see tuning.py), read at the
# first launch on a device; a device without one uses default_skinny_config up to DEFAULT_M_MAX rows.

# Batch-invariant GEMM: one tiling for every M, no split-K.
INVARIANT_CONFIG = SkinnyConfig(block_m=32, block_n=64, block_k=64, split_k=1, num_warps=4, num_stages=3)
_TARGET_PROGRAMS = 264  # ~2 per SM on an H200 (132 SMs)


@jit
def _swiglu(gate, up):
    """silu(gate) * up, rounded as silu_and_mul_ref (and _silu_and_mul_kernel) round: silu in the
    input dtype, then the product in the input dtype."""
    g = gate.to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(gate.dtype).to(tl.float32)
    return (act * up.to(tl.float32)).to(gate.dtype)


@jit
def _add_rms(x, r, rstd, nw):
    """One tile of rms_norm(x + r) * nw given the row's rstd, rounded as add_rms_norm_ref rounds:
    the sum in the input dtype, the normalised value cast back to it, the weight product in it."""
    s = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
    y = (s.to(tl.float32) * rstd).to(x.dtype).to(tl.float32)
    return (nw.to(tl.float32) * y).to(x.dtype)


@jit(do_not_specialize=["M"])
def _linear_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    k_per_split,
    up_off,
    r_ptr,
    nw_ptr,
    s_ptr,
    stride_rm,
    stride_sm,
    eps,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT: tl.constexpr,
    EVEN_K: tl.constexpr,
    PRECISION: tl.constexpr,
    SWIGLU: tl.constexpr,
    NORM: tl.constexpr,
):
    """y = x @ W^T, or with SWIGLU y = (silu(x[:, :K]) * x[:, up_off:up_off + K]) @ W^T: the
    activation is formed per K tile in registers from the gate and up tiles, never stored; or with
    NORM y = rms_norm(x + r) * nw @ W^T: every program first sums the squares of its rows' whole
    x + r (the program with pid_n == pid_k == 0 also stores x + r to s), then normalises each K
    tile in registers."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    w_rows = w_ptr + rn.to(tl.int64)[:, None] * stride_wn
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    rk0 = tl.arange(0, BLOCK_K)
    if BLOCK_M == 1:
        # GEMV (grid M == M): elementwise FMAs into a [BLOCK_N, BLOCK_K] tile, one reduction at the end.
        x_row = x_ptr + pid_m.to(tl.int64) * stride_xm
        if NORM:
            r_row = r_ptr + pid_m.to(tl.int64) * stride_rm
            s_row = s_ptr + pid_m.to(tl.int64) * stride_sm
            writer = (pid_n == 0) & (pid_k == 0)
            ss1 = tl.zeros([BLOCK_K], tl.float32)
            for k in range(0, K, BLOCK_K):
                rk = k + rk0
                km = rk < K
                s = (
                    tl.load(x_row + rk, mask=km, other=0.0).to(tl.float32)
                    + tl.load(r_row + rk, mask=km, other=0.0).to(tl.float32)
                ).to(x_ptr.dtype.element_ty)
                tl.store(s_row + rk, s, mask=km & writer)
                sf = s.to(tl.float32)
                ss1 += sf * sf
            rstd1 = tl.rsqrt(tl.sum(ss1, axis=0) / K + eps)
        acc2 = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
        for k in range(k_lo, k_hi, BLOCK_K):
            rk = k + rk0
            if EVEN_K:
                w = tl.load(w_rows + rk[None, :], mask=n_ok[:, None], other=0.0)
                x = tl.load(x_row + rk)
                if SWIGLU:
                    x = _swiglu(x, tl.load(x_row + up_off + rk))
                if NORM:
                    x = _add_rms(x, tl.load(r_row + rk), rstd1, tl.load(nw_ptr + rk))
            else:
                w = tl.load(w_rows + rk[None, :], mask=n_ok[:, None] & (rk < k_hi)[None, :], other=0.0)
                x = tl.load(x_row + rk, mask=rk < k_hi, other=0.0)
                if SWIGLU:  # masked lanes: silu(0) * 0 = 0
                    x = _swiglu(x, tl.load(x_row + up_off + rk, mask=rk < k_hi, other=0.0))
                if NORM:  # masked lanes: nw = 0
                    x = _add_rms(
                        x,
                        tl.load(r_row + rk, mask=rk < k_hi, other=0.0),
                        rstd1,
                        tl.load(nw_ptr + rk, mask=rk < k_hi, other=0.0),
                    )
            acc2 += w.to(tl.float32) * x.to(tl.float32)[None, :]
        acc1 = tl.sum(acc2, axis=1)
        if not SPLIT:
            tl.store(y_ptr + pid_m.to(tl.int64) * stride_ym + rn, acc1.to(y_ptr.dtype.element_ty), mask=n_ok)
        else:
            tl.store(y_ptr + (pid_k * M + pid_m).to(tl.int64) * N + rn, acc1, mask=n_ok)
    else:
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        m_ok = rm < M
        x_rows = x_ptr + rm.to(tl.int64)[:, None] * stride_xm
        if NORM:
            r_rows = r_ptr + rm.to(tl.int64)[:, None] * stride_rm
            s_rows = s_ptr + rm.to(tl.int64)[:, None] * stride_sm
            writer = (pid_n == 0) & (pid_k == 0)
            ss = tl.zeros([BLOCK_M, BLOCK_K], tl.float32)
            for k in range(0, K, BLOCK_K):
                rk = k + rk0
                msk = m_ok[:, None] & (rk < K)[None, :]
                s = (
                    tl.load(x_rows + rk[None, :], mask=msk, other=0.0).to(tl.float32)
                    + tl.load(r_rows + rk[None, :], mask=msk, other=0.0).to(tl.float32)
                ).to(x_ptr.dtype.element_ty)
                tl.store(s_rows + rk[None, :], s, mask=msk & writer)
                sf = s.to(tl.float32)
                ss += sf * sf
            rstd = tl.rsqrt(tl.sum(ss, axis=1) / K + eps)[:, None]
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k in range(k_lo, k_hi, BLOCK_K):
            rk = k + rk0
            if EVEN_K:
                x = tl.load(x_rows + rk[None, :], mask=m_ok[:, None], other=0.0)
                w = tl.load(w_rows + rk[None, :], mask=n_ok[:, None], other=0.0)
                if SWIGLU:
                    x = _swiglu(x, tl.load(x_rows + up_off + rk[None, :], mask=m_ok[:, None], other=0.0))
                if NORM:
                    x = _add_rms(
                        x,
                        tl.load(r_rows + rk[None, :], mask=m_ok[:, None], other=0.0),
                        rstd,
                        tl.load(nw_ptr + rk)[None, :],
                    )
            else:
                k_ok = (rk < k_hi)[None, :]
                x = tl.load(x_rows + rk[None, :], mask=m_ok[:, None] & k_ok, other=0.0)
                w = tl.load(w_rows + rk[None, :], mask=n_ok[:, None] & k_ok, other=0.0)
                if SWIGLU:
                    x = _swiglu(x, tl.load(x_rows + up_off + rk[None, :], mask=m_ok[:, None] & k_ok, other=0.0))
                if NORM:
                    x = _add_rms(
                        x,
                        tl.load(r_rows + rk[None, :], mask=m_ok[:, None] & k_ok, other=0.0),
                        rstd,
                        tl.load(nw_ptr + rk[None, :], mask=k_ok, other=0.0),
                    )
            acc = tl.dot(x, tl.trans(w), acc, input_precision=PRECISION)
        mask = m_ok[:, None] & n_ok[None, :]
        if not SPLIT:
            dst = y_ptr + rm.to(tl.int64)[:, None] * stride_ym + rn[None, :]
            tl.store(dst, acc.to(y_ptr.dtype.element_ty), mask=mask)
        else:  # fp32 partials [SPLIT_K, M, N], summed in a fixed order by _splitk_reduce_kernel
            tl.store(y_ptr + (pid_k * M + rm.to(tl.int64))[:, None] * N + rn[None, :], acc, mask=mask)


@jit
def _splitk_reduce_kernel(p_ptr, y_ptr, M, N, stride_ym, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = idx < M * N
    acc = tl.zeros([BLOCK], tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(p_ptr + s * M * N + idx, mask=ok, other=0.0)
    tl.store(y_ptr + (idx // N) * stride_ym + idx % N, acc.to(y_ptr.dtype.element_ty), mask=ok)


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


def launch(x: torch.Tensor, weight: torch.Tensor, cfg: SkinnyConfig, swiglu: bool = False, norm=None) -> torch.Tensor:
    """norm: None, or (residual rows, norm weight, summed rows (written), eps) for the NORM prologue."""
    m = x.shape[0]
    n, k = weight.shape
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return y
    assert cfg.block_m != 1 or m == 1, "the GEMV path serves M == 1 only"
    # Whole K tiles per split (the split count is a grid dim, not a compile-time constant).
    k_per_split = cdiv(cdiv(k, cfg.split_k), cfg.block_k) * cfg.block_k
    even_k = k % cfg.block_k == 0
    out = y if cfg.split_k == 1 else torch.empty(cfg.split_k, m, n, dtype=torch.float32, device=x.device)
    grid = (cdiv(n, cfg.block_n), cdiv(m, cfg.block_m), cfg.split_k)
    r, nw, summed, eps = norm if norm is not None else (x, x, x, 0.0)
    _linear_kernel[grid](
        x,
        weight,
        out,
        m,
        n,
        k,
        x.stride(0),
        weight.stride(0),
        y.stride(0),
        k_per_split,
        k if swiglu else 0,
        r,
        nw,
        summed,
        r.stride(0),
        summed.stride(0),
        eps,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        SPLIT=cfg.split_k > 1,
        EVEN_K=even_k,
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        SWIGLU=swiglu,
        NORM=norm is not None,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    if cfg.split_k > 1:
        block = 1024
        _splitk_reduce_kernel[(cdiv(m * n, block),)](
            out, y, m, n, y.stride(0), SPLIT_K=cfg.split_k, BLOCK=block, num_warps=4
        )
    return y


def linear_with_config(x: torch.Tensor, weight: torch.Tensor, cfg: SkinnyConfig) -> torch.Tensor:
    """y = x @ W^T with an explicit Triton config; x: [M, K] unit-stride rows, W: [N, K] contiguous."""
    assert x.shape[1] == weight.shape[1], (x.shape, weight.shape)
    return launch(x, weight, cfg)


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


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Triton skinny-M projection where it beats cuBLAS (see skinny_config), F.linear elsewhere."""
    cfg = dispatch_config(skinny_config, x, weight, weight.shape[1])
    if cfg is None:
        return F.linear(x, weight)
    return linear_with_config(as_rows(x), weight, cfg).view(*x.shape[:-1], weight.shape[0])


def linear_batch_invariant(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Batch-invariant Triton GEMM: fixed tiles and K order for every M, so row i is bit-identical
    whether the call has 1 or 64 rows."""
    n = weight.shape[0]
    y = linear_with_config(as_rows(x), weight.contiguous(), INVARIANT_CONFIG)
    return y.view(*x.shape[:-1], n)
