"""The skinny-M Triton GEMM behind every projection (linear.py dispatches to it): y = x @ W^T with
optional prologues that form the activation in registers (SWIGLU for the MLP's down projection, NORM
for a residual add + RMSNorm before q|k|v and gate|up; helpers in gemm_prologues.py), or a SwiGLU
epilogue (GLU, the MLP's gate|up). One-row configs of the prologues in EARLY_WEIGHTS run gemv.py's
kernel. A split-K result is reduced by split_sum.py's kernel, or handed back as its partials
(`SplitSum`, launch(defer=True)) for the next add + RMSNorm to sum."""

from __future__ import annotations

import torch

from engine.kernels import gemm_tma
from engine.kernels._triton import cdiv, jit, pdl
from engine.kernels.gemm_prologues import _add_scale, _pdl_start, _prologue_tiles, _swiglu
from engine.kernels.gemv import _gemv_kernel
from engine.kernels.split_sum import SplitSum, reduce_parts
from engine.kernels.tuning import SkinnyConfig

tl = None  # triton.language, bound by _triton.bind at the first launch
# One-row configs of these kinds run gemv.py's kernel (the first weight tile before the PDL wait, the
# next carried in registers); the others this module's wait-first path. On the H200 (kernel_ab at
# 03985b1) it won with the norm prologue (q|k|v 9.5 -> 8.7 us, gate|up 28.6 -> 27.2) and lost for o
# (7.6 -> 7.8 at best) and SwiGLU->down (15.2 -> 15.6 at best) followed by their reduce kernel. With
# the reduce deferred (kind "deferred": o or down handing back a SplitSum) o followed by norm->gate|up
# went 35.9 -> 33.3 us on it (kernel_ab at 21d8dcd; down equal).
PROLOGUES = frozenset({"plain", "swiglu", "norm", "deferred"})
EARLY_WEIGHTS: frozenset[str] = frozenset({"norm", "deferred"})
# Rows up to which launch(defer=True) hands back a SplitSum (0: never). One: above
# it norm.add_rms_norm is the consumer, one program a row reading every plane, and at 8 rows (down
# split 8) the step ran 3.5 % slower than with the reduce kernel (decode_ab at f85d1cc, H200).
DEFER_MAX_ROWS = 1


@jit(do_not_specialize=["M"])
def _linear_kernel(
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
    PREFETCH: tl.constexpr,
    PDL: tl.constexpr,
    GLU: tl.constexpr,
):
    """y = x @ W^T, or with SWIGLU y = (silu(x[:, :K]) * x[:, up_off:up_off + K]) @ W^T: the
    activation is formed per K tile in registers from the gate and up tiles, never stored; or with
    NORM (no split) y = rms_norm(x + r) * nw @ W^T in one pass: each K tile of x + r feeds both the
    sum of squares and the product, and the accumulator is scaled by 1/rms at the end (the programs
    with pid_n == 0 also store x + r to s). SPLIT: fp32 partials [SPLIT_K, M, N] to p, summed in
    split order by split_sum._splitk_reduce_kernel. GLU (tl.dot path, no split): W is [2N, K] = [gate | up] and
    y = silu(x @ W[:N]^T) * (x @ W[N:]^T), each program owning the same N columns of both halves and
    rounding as silu_and_mul does the [M, 2N] product the plain kernel would store."""
    _pdl_start(PDL, GLU)
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    w_rows = w_ptr + rn.to(tl.int64)[:, None] * stride_wn
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    rk0 = tl.arange(0, BLOCK_K)
    writer = pid_n == 0
    if BLOCK_M == 1:
        # GEMV (grid M == M): elementwise FMAs into a [BLOCK_N, BLOCK_K] tile, one reduction at the end.
        x_row = x_ptr + pid_m.to(tl.int64) * stride_xm
        r_row = r_ptr + pid_m.to(tl.int64) * stride_rm
        s_row = s_ptr + pid_m.to(tl.int64) * stride_sm
        ss1 = tl.zeros([BLOCK_K], tl.float32)
        acc2 = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
        for k in range(k_lo, k_hi, BLOCK_K):
            rk = k + rk0
            k_ok = rk < k_hi
            if EVEN_K:
                w = tl.load(w_rows + rk[None, :], mask=n_ok[:, None], other=0.0)
                x = tl.load(x_row + rk)
                if SWIGLU:
                    x = _swiglu(x, tl.load(x_row + up_off + rk))
                if NORM:
                    s, x = _add_scale(x, tl.load(r_row + rk), tl.load(nw_ptr + rk))
            else:  # masked lanes: silu(0) * 0 = 0; x = r = 0 adds nothing to the sum of squares
                w = tl.load(w_rows + rk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
                x = tl.load(x_row + rk, mask=k_ok, other=0.0)
                if SWIGLU:
                    x = _swiglu(x, tl.load(x_row + up_off + rk, mask=k_ok, other=0.0))
                if NORM:
                    r = tl.load(r_row + rk, mask=k_ok, other=0.0)
                    s, x = _add_scale(x, r, tl.load(nw_ptr + rk, mask=k_ok, other=0.0))
            if NORM:
                tl.store(s_row + rk, s, mask=k_ok & writer)
                ss1 += s.to(tl.float32) * s.to(tl.float32)
            acc2 += w.to(tl.float32) * x.to(tl.float32)[None, :]
        acc1 = tl.sum(acc2, axis=1)
        if NORM:
            acc1 = acc1 * tl.rsqrt(tl.sum(ss1, axis=0) / K + eps)
        if not SPLIT:
            tl.store(y_ptr + pid_m.to(tl.int64) * stride_ym + rn, acc1.to(y_ptr.dtype.element_ty), mask=n_ok)
        else:
            tl.store(p_ptr + (pid_k * M + pid_m).to(tl.int64) * N + rn, acc1, mask=n_ok)
    else:
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        m_ok = rm < M
        x_rows = x_ptr + rm.to(tl.int64)[:, None] * stride_xm
        r_rows = r_ptr + rm.to(tl.int64)[:, None] * stride_rm
        s_rows = s_ptr + rm.to(tl.int64)[:, None] * stride_sm
        ss = tl.zeros([BLOCK_M], tl.float32)  # per-row sums: a [BLOCK_M, BLOCK_K] fp32 tile costs registers
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        acc_up = acc
        up_rows = w_ptr + (rn + N).to(tl.int64)[:, None] * stride_wn
        if PREFETCH:  # the prologue's reads run a tile ahead (see launch)
            x_next, aux_next, nw_next = _prologue_tiles(
                x_rows, r_rows, nw_ptr, up_off, k_lo + rk0, m_ok, k_hi, SWIGLU, NORM
            )
        for k in range(k_lo, k_hi, BLOCK_K):
            rk = k + rk0
            k_ok = (rk < k_hi)[None, :]
            wm = n_ok[:, None] if EVEN_K else n_ok[:, None] & k_ok
            xm = m_ok[:, None] if EVEN_K else m_ok[:, None] & k_ok
            w = tl.load(w_rows + rk[None, :], mask=wm, other=0.0)
            if GLU:
                w_up = tl.load(up_rows + rk[None, :], mask=wm, other=0.0)
            if PREFETCH:
                x, aux, nw = x_next, aux_next, nw_next
                x_next, aux_next, nw_next = _prologue_tiles(
                    x_rows, r_rows, nw_ptr, up_off, rk + BLOCK_K, m_ok, k_hi, SWIGLU, NORM
                )
            elif SWIGLU or NORM:
                x, aux, nw = _prologue_tiles(x_rows, r_rows, nw_ptr, up_off, rk, m_ok, k_hi, SWIGLU, NORM)
            else:
                x = tl.load(x_rows + rk[None, :], mask=xm, other=0.0)
            if SWIGLU:
                x = _swiglu(x, aux)
            if NORM:
                s, x = _add_scale(x, aux, nw[None, :])
                tl.store(s_rows + rk[None, :], s, mask=xm & writer)
                ss += tl.sum(s.to(tl.float32) * s.to(tl.float32), axis=1)
            acc = tl.dot(x, tl.trans(w), acc, input_precision=PRECISION)
            if GLU:
                acc_up = tl.dot(x, tl.trans(w_up), acc_up, input_precision=PRECISION)
        if NORM:
            acc = acc * tl.rsqrt(ss / K + eps)[:, None]
        if GLU:
            dtype = y_ptr.dtype.element_ty
            acc = _swiglu(acc.to(dtype), acc_up.to(dtype))
        mask = m_ok[:, None] & n_ok[None, :]
        if not SPLIT:
            dst = y_ptr + rm.to(tl.int64)[:, None] * stride_ym + rn[None, :]
            tl.store(dst, acc.to(y_ptr.dtype.element_ty), mask=mask)
        else:
            tl.store(p_ptr + (pid_k * M + rm.to(tl.int64))[:, None] * N + rn[None, :], acc, mask=mask)


def launch(
    x: torch.Tensor | SplitSum,
    weight: torch.Tensor,
    cfg: SkinnyConfig,
    swiglu: bool = False,
    norm=None,
    defer: bool = False,
    out: torch.Tensor | None = None,
    glu: bool = False,
    tma: bool = True,
    defer_rows: int | None = None,
) -> torch.Tensor | SplitSum:
    """norm: None, or (residual rows, norm weight, summed rows (written), eps) for the NORM prologue
    (split_k 1 only); x may then be a SplitSum, summed in the prologue on the early-weights GEMV (and
    by its reduce elsewhere). defer: a split-K result of up to DEFER_MAX_ROWS rows (defer_rows where
    given: a consumer that sums partials at any row count) comes back as a SplitSum, with no reduce
    launched. out: the [M, N] result's buffer (contiguous), instead of a new one.
    glu: weight is [2N, K] = [gate | up] and y = silu(x @ gate^T) * (x @ up^T), [M, N] (tl.dot path,
    split_k 1, no prologue). tma: False keeps the call off the TMA GEMM whatever cfg says (batch-invariant
    mode: one kernel at every row count)."""
    n, k = weight.shape
    if glu:
        assert cfg.block_m > 1 and cfg.split_k == 1 and not swiglu and norm is None and n % 2 == 0, cfg
        n //= 2
    m = x.shape[0]
    split = cfg.split_k > 1
    deferred = split and defer and m <= (DEFER_MAX_ROWS if defer_rows is None else defer_rows)
    kind = "deferred" if deferred else "norm" if norm is not None else "swiglu" if swiglu else "plain"
    gemv = cfg.block_m == 1 and kind in EARLY_WEIGHTS
    planes = 0
    if isinstance(x, SplitSum):
        if norm is not None and gemv:
            x, planes = x.parts, x.parts.shape[0]
        else:
            x = x.tensor()
    x_rows = x[0] if planes else x
    dtype = norm[0].dtype if planes else x.dtype
    assert out is None or (not defer and out.shape == (m, n) and out.is_contiguous() and out.dtype == dtype)
    if m == 0:
        return torch.empty(m, n, dtype=dtype, device=x.device) if out is None else out
    assert cfg.block_m != 1 or m == 1, "the GEMV path serves M == 1 only"
    assert norm is None or cfg.split_k == 1, "the NORM prologue needs whole rows: split_k 1"
    # Whole K tiles per split (the split count is a grid dim, not a compile-time constant).
    k_per_split = cdiv(cdiv(k, cfg.split_k), cfg.block_k) * cfg.block_k
    grid = (cdiv(n, cfg.block_n), cdiv(m, cfg.block_m), cfg.split_k)
    y = None if deferred else out if out is not None else torch.empty(m, n, dtype=dtype, device=x.device)
    parts = torch.empty(cfg.split_k, m, n, dtype=torch.float32, device=x.device) if split else y
    r, nw, summed, eps = norm if norm is not None else (x, x, x, 0.0)
    args = (x, weight, y if y is not None else parts, parts, m, n, k, x_rows.stride(0), weight.stride(0), n)
    args += (k_per_split, k if swiglu else m * k if planes else 0, r, nw, summed, r.stride(0), summed.stride(0), eps)
    meta = dict(BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT=split, SWIGLU=swiglu, NORM=norm is not None)
    meta.update(num_warps=cfg.num_warps, num_stages=cfg.num_stages, **pdl(x.device, m))
    if gemv:
        meta.update(num_stages=1, CARRY=cfg.num_stages >= 2)  # see gemv.py
        even_k = k % cfg.block_k == 0 and not split
        _gemv_kernel[grid](*args, EVEN_K=even_k, PLANES=planes, **meta)
    elif tma and cfg.tma and kind in ("plain", "deferred") and gemm_tma.serves(x, weight, cfg):
        # tma=1: on the H200 at 32-64 rows 0.91-0.96x the time of the tl.dot path (o, down, gate|up)
        gemm_tma.launch(x, weight, cfg, parts, glu=glu)
    else:
        precision = "ieee" if x.dtype == torch.float32 else "tf32"
        # The prologues (SWIGLU, NORM) read their tiles one K step ahead, into registers: the pipeliner
        # stages only loads that feed tl.dot, and an activation formed in registers waited for each
        # tile's read (at 2-16 rows ~0.5 of the copy bandwidth against ~0.8 for the unfused pairs).
        prefetch = cfg.block_m > 1 and (swiglu or norm is not None)
        _linear_kernel[grid](
            *args,
            BLOCK_M=cfg.block_m,
            EVEN_K=k % cfg.block_k == 0,
            PRECISION=precision,
            PREFETCH=prefetch,
            GLU=glu,
            **meta,
        )
    if deferred:
        return SplitSum(parts, dtype)
    return reduce_parts(parts, y) if split else y
