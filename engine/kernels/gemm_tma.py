"""The skinny-M GEMM with its tiles brought in by the tensor memory accelerator (TMA, sm90+): gemm.launch
runs it for plain and GLU projections whose tl.dot config has tma=1 (tuning.SkinnyConfig), a deferred
split-K result's partials included.

One thread of a program issues each tile's copy, so the weight stream costs no per-thread address
arithmetic and no registers, and the pipeliner keeps num_stages tiles in flight on mbarriers. The
product is computed swapped, W_tile @ x_tile^T: the weight tile (BLOCK_N, a multiple of 64) is the
MMA's M side, so the warpgroup MMA serves 16-64 rows of x. Same results as gemm._linear_kernel's
tl.dot path: fp32 accumulation over the same K tiles, split-K partials summed by split_sum."""

from __future__ import annotations

import torch

from engine.kernels._triton import cdiv, jit, pdl, sm90
from engine.kernels.gemm_prologues import _pdl_start, _swiglu
from engine.kernels.tuning import SkinnyConfig

tl = None  # triton.language, bound by _triton.bind at the first launch


@jit(do_not_specialize=["M"])
def _linear_tma_kernel(
    x_desc,
    w_desc,
    y_ptr,
    M,
    N,
    K,
    stride_ym,
    k_per_split,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL: tl.constexpr,
    GLU: tl.constexpr,
):
    """y = x @ W^T, or with GLU (W = [gate | up], [2N, K]) y = silu(x @ gate^T) * (x @ up^T) rounded as
    silu_and_mul rounds; SPLIT: fp32 partials [SPLIT_K, M, N] to y_ptr. Tiles past M, N or K read zeros."""
    _pdl_start(PDL, GLU)
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    off_n = pid_n * BLOCK_N
    off_m = pid_m * BLOCK_M
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    acc_up = acc
    for k in range(k_lo, k_hi, BLOCK_K):
        x = x_desc.load([off_m, k])
        acc = tl.dot(w_desc.load([off_n, k]), tl.trans(x), acc, input_precision=PRECISION)
        if GLU:
            acc_up = tl.dot(w_desc.load([N + off_n, k]), tl.trans(x), acc_up, input_precision=PRECISION)
    rn = off_n + tl.arange(0, BLOCK_N)
    rm = off_m + tl.arange(0, BLOCK_M)
    mask = (rn < N)[:, None] & (rm < M)[None, :]
    if GLU:
        dtype = y_ptr.dtype.element_ty
        acc = _swiglu(acc.to(dtype), acc_up.to(dtype))
    if SPLIT:
        tl.store(y_ptr + (pid_k * M + rm.to(tl.int64))[None, :] * N + rn[:, None], acc, mask=mask)
    else:
        dst = y_ptr + rm.to(tl.int64)[None, :] * stride_ym + rn[:, None]
        tl.store(dst, acc.to(y_ptr.dtype.element_ty), mask=mask)


def _aligned(t: torch.Tensor) -> bool:
    """TMA's rule for a row-major matrix: 16-byte base and row pitch."""
    return t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0 and t.stride(1) == 1


def serves(x: torch.Tensor, weight: torch.Tensor, cfg: SkinnyConfig) -> bool:
    """Whether launch() can run this call: a tl.dot config with a weight tile of at least 16 rows, TMA's
    alignment on both operands, and a device with TMA (the interpreter emulates it)."""
    if cfg.block_m < 16 or cfg.block_n < 16 or not (_aligned(x) and _aligned(weight)):
        return False
    return x.device.type == "cpu" or sm90(x.device)


def launch(x: torch.Tensor, weight: torch.Tensor, cfg: SkinnyConfig, y: torch.Tensor, glu: bool = False) -> None:
    """Fill y ([M, N], or the fp32 partials [split_k, M, N] where cfg splits K) with x @ W^T (glu: see
    the kernel). x: [M, K] rows, weight: [N, K] ([2N, K] with glu), both TMA-aligned (serves())."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    m, k = x.shape
    n = weight.shape[0] // 2 if glu else weight.shape[0]
    k_per_split = cdiv(cdiv(k, cfg.split_k), cfg.block_k) * cfg.block_k
    x_desc = TensorDescriptor.from_tensor(x, [cfg.block_m, cfg.block_k])
    w_desc = TensorDescriptor.from_tensor(weight, [cfg.block_n, cfg.block_k])
    grid = (cdiv(n, cfg.block_n), cdiv(m, cfg.block_m), cfg.split_k)
    _linear_tma_kernel[grid](
        x_desc,
        w_desc,
        y,
        m,
        n,
        k,
        y.stride(-2),
        k_per_split,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        SPLIT=cfg.split_k > 1,
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        GLU=glu,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **pdl(x.device, m),
    )
