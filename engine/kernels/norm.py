"""RMSNorm and fused residual-add + RMSNorm."""

from __future__ import annotations

import torch

from engine.kernels._triton import jit, next_pow2, pdl
from engine.kernels.split_sum import SplitSum, dense


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF Qwen3RMSNorm: normalise in fp32, cast back, then scale in the input dtype."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * y.to(x.dtype)


def add_rms_norm_ref(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (rms_norm(x + residual), x + residual); the sum is taken in the input dtype."""
    summed = x + residual
    return rms_norm_ref(summed, weight, eps), summed


# --- Triton ---------------------------------------------------------------------------------
tl = None  # triton.language, bound by _triton.bind at the first launch


@jit
def _rms_norm_kernel(
    x_ptr,
    r_ptr,
    w_ptr,
    out_ptr,
    sum_ptr,
    stride_x,
    stride_r,
    stride_o,
    stride_s,
    n_cols,
    eps,
    plane,
    HAS_RESIDUAL: tl.constexpr,
    PLANES: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    """PLANES > 0: x is a projection's fp32 split-K partials (`plane` elements apart), summed in split
    order from zero and rounded to the sum's dtype, as split_sum._splitk_reduce_kernel does."""
    if PDL:  # wait for the previous kernel's writes, then let the next kernel launch
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    if PLANES > 0:
        xs = tl.zeros([BLOCK], tl.float32)
        for p in tl.static_range(PLANES):
            xs += tl.load(x_ptr + p * plane + row * stride_x + cols, mask=mask, other=0.0)
        x = xs.to(sum_ptr.dtype.element_ty)
    else:
        x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(r_ptr + row * stride_r + cols, mask=mask, other=0.0)
        # The residual stream is rounded to its dtype before the norm, as in the reference.
        x = (x.to(tl.float32) + r.to(tl.float32)).to(sum_ptr.dtype.element_ty)
        tl.store(sum_ptr + row * stride_s + cols, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, axis=0) / n_cols + eps)
    # HF casts the normalised row back to the input dtype before the weight multiply.
    y = (xf * rstd).to(x.dtype).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (w * y).to(out_ptr.dtype.element_ty), mask=mask)


def _rows(x: torch.Tensor) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def _norm_launch(x2, r2, weight, out, summed, eps: float, planes: int = 0) -> None:
    """planes > 0: x2 is the first of `planes` [rows, cols] fp32 partials, contiguous one after another."""
    rows, cols = x2.shape
    if rows == 0:
        return
    block = next_pow2(cols)
    num_warps = 4 if block <= 1024 else (8 if block <= 4096 else 16)
    has_res = r2 is not None
    _rms_norm_kernel[(rows,)](
        x2,
        r2 if has_res else x2,
        weight,
        out,
        summed if has_res else out,
        x2.stride(0),
        r2.stride(0) if has_res else 0,
        out.stride(0),
        summed.stride(0) if has_res else 0,
        cols,
        eps,
        rows * cols,
        HAS_RESIDUAL=has_res,
        PLANES=planes,
        BLOCK=block,
        num_warps=num_warps,
        **pdl(x2.device, rows),
    )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Triton `rms_norm_ref`: one program per row, the whole row (<= 8192 wide) in registers."""
    x2 = _rows(x)
    out = torch.empty(x2.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    _norm_launch(x2, None, weight, out, None, eps)
    return out.view(x.shape)


def add_rms_norm(
    x: torch.Tensor | SplitSum, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton `add_rms_norm_ref`: the residual add and the norm in one pass. A SplitSum x of the
    residual's dtype is summed in the same pass (bit-identical to its reduce kernel, one launch fewer)."""
    planes = 0
    if isinstance(x, SplitSum) and x.dtype == residual.dtype and residual.dim() == 2:
        x, planes = x.parts, x.parts.shape[0]
    x = dense(x)
    x2, r2 = x[0] if planes else _rows(x), _rows(residual)
    sum_dtype = residual.dtype if planes else torch.promote_types(x.dtype, residual.dtype)
    summed = torch.empty(x2.shape, dtype=sum_dtype, device=x.device)
    out = torch.empty(x2.shape, dtype=torch.promote_types(sum_dtype, weight.dtype), device=x.device)
    _norm_launch(x2, r2, weight, out, summed, eps, planes)
    return out.view(residual.shape), summed.view(residual.shape)
