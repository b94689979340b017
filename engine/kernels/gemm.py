"""The skinny-M Triton GEMM behind every projection (linear.py dispatches to it): y = x @ W^T with
optional prologues that form the activation in registers (SWIGLU for the MLP's down projection, NORM
for a residual add + RMSNorm before q|k|v and gate|up), and the deterministic split-K reduce. The
prologue helpers live here because the lazy triton binding resolves a kernel's helpers in its module."""

from __future__ import annotations

import torch

from engine.kernels._triton import cdiv, jit
from engine.kernels.tuning import SkinnyConfig

tl = None  # triton.language, bound by _triton.bind at the first launch


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
