"""The one-row projection (GEMV) with its weight stream started before the PDL wait (gemm.launch
runs it for block_m == 1 configs whose prologue is in gemm.EARLY_WEIGHTS).

At one row a projection is a weight stream: its time is bytes / (bytes in flight per SM / latency).
Two things keep bytes in flight that the wait-first GEMV in gemm.py leaves idle:
- the first weight tile is loaded before `griddepcontrol.wait`: weights never depend on the previous
  kernel, so under PDL the tile streams while that kernel drains; only the activation (x, and r for
  the NORM prologue) is read after the wait. The contract: W is not written by the kernel launched
  just before (every caller passes model weights; earlier kernels are done, since each PDL kernel
  waits before it lets its successor launch);
- with CARRY (a config's num_stages >= 2; Triton 3.6 does not pipeline these loads, so num_stages
  meant nothing on the GEMV path) the loop carries the next weight tile in registers, loaded before
  the current one is used: two tiles in flight per program (2 x BLOCK_N x BLOCK_K x 2 bytes in
  bf16), so a whole-K program (split_k 1) keeps as many bytes in flight as the split-K programs did,
  with no partials and no reduce kernel. It costs registers (the second tile): an occupancy trade
  each config makes (the add + RMSNorm configs keep one tile, see the tuned table).
"""

from __future__ import annotations

from engine.kernels._triton import jit
from engine.kernels.gemm_prologues import _add_scale, _swiglu

tl = None  # triton.language, bound by _triton.bind at the first launch


@jit
def _weight_tile(w_rows, rk, n_ok, k_hi, EVEN_K: tl.constexpr):
    if EVEN_K:
        return tl.load(w_rows + rk[None, :], mask=n_ok[:, None], other=0.0)
    return tl.load(w_rows + rk[None, :], mask=n_ok[:, None] & (rk < k_hi)[None, :], other=0.0)


@jit
def _fma_tile(
    acc2,
    ss1,
    w,
    rk,
    k_hi,
    x_row,
    r_row,
    s_row,
    nw_ptr,
    x_off,
    writer,
    EVEN_K: tl.constexpr,
    SWIGLU: tl.constexpr,
    NORM: tl.constexpr,
    PLANES: tl.constexpr,
):
    """acc2 += w * x for one K tile, x formed by the prologue (masked lanes: silu(0) * 0 = 0, and
    x = r = 0 adds nothing to the sum of squares); NORM stores x + r from the pid_n == 0 programs.
    x_off: from x to up's columns (SWIGLU) or to the next plane (PLANES > 0: x is the producer's
    fp32 split-K partials, summed in split order from zero and rounded to r's dtype, as
    split_sum._splitk_reduce_kernel does)."""
    k_ok = rk < k_hi
    if PLANES > 0:
        xs = tl.zeros_like(rk).to(tl.float32)
        for p in tl.static_range(PLANES):
            xs += tl.load(x_row + p * x_off + rk, mask=k_ok, other=0.0)
        x = xs.to(r_row.dtype.element_ty)
        s, x = _add_scale(x, tl.load(r_row + rk, mask=k_ok, other=0.0), tl.load(nw_ptr + rk, mask=k_ok, other=0.0))
    elif EVEN_K:
        x = tl.load(x_row + rk)
        if SWIGLU:
            x = _swiglu(x, tl.load(x_row + x_off + rk))
        if NORM:
            s, x = _add_scale(x, tl.load(r_row + rk), tl.load(nw_ptr + rk))
    else:
        x = tl.load(x_row + rk, mask=k_ok, other=0.0)
        if SWIGLU:
            x = _swiglu(x, tl.load(x_row + x_off + rk, mask=k_ok, other=0.0))
        if NORM:
            r = tl.load(r_row + rk, mask=k_ok, other=0.0)
            s, x = _add_scale(x, r, tl.load(nw_ptr + rk, mask=k_ok, other=0.0))
    if NORM:
        tl.store(s_row + rk, s, mask=k_ok & writer)
        ss1 += s.to(tl.float32) * s.to(tl.float32)
    return acc2 + w.to(tl.float32) * x.to(tl.float32)[None, :], ss1


@jit(do_not_specialize=["M"])
def _gemv_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    p_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    k_per_split,
    x_off,
    r_ptr,
    nw_ptr,
    s_ptr,
    stride_rm,
    stride_sm,
    eps,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT: tl.constexpr,
    EVEN_K: tl.constexpr,
    SWIGLU: tl.constexpr,
    NORM: tl.constexpr,
    CARRY: tl.constexpr,
    PLANES: tl.constexpr,
    PDL: tl.constexpr,
):
    """gemm._linear_kernel's GEMV path (same arguments and results; EVEN_K only without split-K,
    since an empty split still loads its first tile, masked): one program per BLOCK_N rows of W
    and split of K, grid (N tiles, M, splits). CARRY: two weight tiles in flight (the config's
    num_stages >= 2), else one (the wait-first path's register footprint). PLANES (NORM only): x is
    a SplitSum's partials (see _fma_tile)."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    w_rows = w_ptr + rn.to(tl.int64)[:, None] * stride_wn
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    rk0 = tl.arange(0, BLOCK_K)
    w = _weight_tile(w_rows, k_lo + rk0, n_ok, k_hi, EVEN_K)  # before the wait: see the module docstring
    if PDL:  # now wait for the previous kernel's writes (x, r), then let the next kernel launch
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    x_row = x_ptr + pid_m.to(tl.int64) * stride_xm
    r_row = r_ptr + pid_m.to(tl.int64) * stride_rm
    s_row = s_ptr + pid_m.to(tl.int64) * stride_sm
    writer = pid_n == 0
    ss1 = tl.zeros([BLOCK_K], tl.float32)
    acc2 = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    if CARRY:  # the next tile is in flight while this one is used
        k_last = k_lo + (tl.maximum(k_hi - k_lo, 1) - 1) // BLOCK_K * BLOCK_K  # an empty split: k_lo
        for k in range(k_lo, k_last, BLOCK_K):
            w_next = _weight_tile(w_rows, k + BLOCK_K + rk0, n_ok, k_hi, EVEN_K)
            acc2, ss1 = _fma_tile(
                acc2, ss1, w, k + rk0, k_hi, x_row, r_row, s_row, nw_ptr, x_off, writer, EVEN_K, SWIGLU, NORM, PLANES
            )
            w = w_next
        acc2, ss1 = _fma_tile(
            acc2, ss1, w, k_last + rk0, k_hi, x_row, r_row, s_row, nw_ptr, x_off, writer, EVEN_K, SWIGLU, NORM, PLANES
        )
    else:  # the first tile peeled; then load-and-use per tile, as the wait-first loop does
        acc2, ss1 = _fma_tile(
            acc2, ss1, w, k_lo + rk0, k_hi, x_row, r_row, s_row, nw_ptr, x_off, writer, EVEN_K, SWIGLU, NORM, PLANES
        )
        for k in range(k_lo + BLOCK_K, k_hi, BLOCK_K):
            w = _weight_tile(w_rows, k + rk0, n_ok, k_hi, EVEN_K)
            acc2, ss1 = _fma_tile(
                acc2, ss1, w, k + rk0, k_hi, x_row, r_row, s_row, nw_ptr, x_off, writer, EVEN_K, SWIGLU, NORM, PLANES
            )
    acc1 = tl.sum(acc2, axis=1)
    if NORM:
        acc1 = acc1 * tl.rsqrt(tl.sum(ss1, axis=0) / K + eps)
    if not SPLIT:
        tl.store(y_ptr + pid_m.to(tl.int64) * stride_ym + rn, acc1.to(y_ptr.dtype.element_ty), mask=n_ok)
    else:
        tl.store(p_ptr + (pid_k * M + pid_m).to(tl.int64) * N + rn, acc1, mask=n_ok)
