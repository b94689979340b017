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


@jit
def _weight_rows(w_ptr, t, stride_wn, N, BLOCK_N: tl.constexpr):
    """Tile t's rows of W: their pointers and which exist."""
    rn = t * BLOCK_N + tl.arange(0, BLOCK_N)
    return w_ptr + rn.to(tl.int64)[:, None] * stride_wn, rn < N


@jit
def _store_tile(acc2, ss1, t, y_row, p_row, N, K, eps, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, NORM: tl.constexpr):
    """Tile t's rows of y (or of its split's partials): the K tiles' products summed, normalised
    where the NORM prologue formed x."""
    rn = t * BLOCK_N + tl.arange(0, BLOCK_N)
    acc1 = tl.sum(acc2, axis=1)
    if NORM:
        acc1 = acc1 * tl.rsqrt(tl.sum(ss1, axis=0) / K + eps)
    if not SPLIT:
        tl.store(y_row + rn, acc1.to(y_row.dtype.element_ty), mask=rn < N)
    else:
        tl.store(p_row + rn, acc1, mask=rn < N)


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
    tiles_per,
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
    since an empty split still loads its first tile, masked): grid (programs, M, splits), each
    program `tiles_per` consecutive BLOCK_N-row tiles of W (the last program fewer) over its split
    of K. CARRY: two weight tiles in flight (the config's num_stages >= 2, or several tiles a
    program: the carried tile crosses into the next rows, so the stream never stops), else one
    (the wait-first path's register footprint; one tile a program). PLANES (NORM only): x is a
    SplitSum's partials (see _fma_tile)."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    t = pid_n * tiles_per
    t_end = tl.minimum(t + tiles_per, tl.cdiv(N, BLOCK_N))
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    rk0 = tl.arange(0, BLOCK_K)
    w_rows, n_ok = _weight_rows(w_ptr, t, stride_wn, N, BLOCK_N)
    w = _weight_tile(w_rows, k_lo + rk0, n_ok, k_hi, EVEN_K)  # before the wait: see the module docstring
    if PDL:  # now wait for the previous kernel's writes (x, r), then let the next kernel launch
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    x_row = x_ptr + pid_m.to(tl.int64) * stride_xm
    r_row = r_ptr + pid_m.to(tl.int64) * stride_rm
    s_row = s_ptr + pid_m.to(tl.int64) * stride_sm
    y_row = y_ptr + pid_m.to(tl.int64) * stride_ym
    p_row = p_ptr + (pid_k * M + pid_m).to(tl.int64) * N
    ss1 = tl.zeros([BLOCK_K], tl.float32)
    acc2 = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    if CARRY:  # the next tile (of these rows, or at a tile's last K step of the next rows) is in flight
        k_steps = tl.maximum(tl.cdiv(k_hi - k_lo, BLOCK_K), 1)  # an empty split: one masked step
        n_iters = (t_end - t) * k_steps
        k = k_lo
        for i in range(0, n_iters):
            tile_done = k + BLOCK_K >= k_lo + k_steps * BLOCK_K
            k_next = tl.where(tile_done, k_lo, k + BLOCK_K)
            t_next = tl.where(tile_done, t + 1, t)
            next_rows, next_ok = _weight_rows(w_ptr, t_next, stride_wn, N, BLOCK_N)
            w_next = _weight_tile(next_rows, k_next + rk0, next_ok & (i + 1 < n_iters), k_hi, EVEN_K)
            acc2, ss1 = _fma_tile(
                acc2, ss1, w, k + rk0, k_hi, x_row, r_row, s_row, nw_ptr, x_off, t == 0, EVEN_K, SWIGLU, NORM, PLANES
            )
            if tile_done:
                _store_tile(acc2, ss1, t, y_row, p_row, N, K, eps, BLOCK_N, SPLIT, NORM)
                acc2 = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
                ss1 = tl.zeros([BLOCK_K], tl.float32)
            w = w_next
            k = k_next
            t = t_next
    else:  # one tile a program: the first K tile peeled, then load-and-use, as the wait-first loop does
        writer = t == 0
        acc2, ss1 = _fma_tile(
            acc2, ss1, w, k_lo + rk0, k_hi, x_row, r_row, s_row, nw_ptr, x_off, writer, EVEN_K, SWIGLU, NORM, PLANES
        )
        for k in range(k_lo + BLOCK_K, k_hi, BLOCK_K):
            w = _weight_tile(w_rows, k + rk0, n_ok, k_hi, EVEN_K)
            acc2, ss1 = _fma_tile(
                acc2, ss1, w, k + rk0, k_hi, x_row, r_row, s_row, nw_ptr, x_off, writer, EVEN_K, SWIGLU, NORM, PLANES
            )
        _store_tile(acc2, ss1, t, y_row, p_row, N, K, eps, BLOCK_N, SPLIT, NORM)
