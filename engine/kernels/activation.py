"""SwiGLU activation on a fused gate|up projection."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.kernels._triton import cdiv, jit, pdl


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """x: [M, 2I] laid out as [gate | up]; returns silu(gate) * up, [M, I]."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


# --- Triton ---------------------------------------------------------------------------------
tl = None  # triton.language, bound by _triton.bind at the first launch


@jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x, stride_o, inter, BLOCK: tl.constexpr, PDL: tl.constexpr):
    if PDL:  # wait for the previous kernel's writes, then let the next kernel launch
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < inter
    gate = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + inter + cols, mask=ok, other=0.0).to(tl.float32)
    # Rounded like the reference: silu(gate) in the input dtype, then the product.
    act = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (act * up).to(out_ptr.dtype.element_ty), mask=ok)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """Triton `silu_and_mul_ref`: grid (rows, I / BLOCK)."""
    inter = x.shape[-1] // 2
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(x2.shape[0], inter, dtype=x.dtype, device=x.device)
    if x2.shape[0] and inter:
        block = 1024
        _silu_and_mul_kernel[(x2.shape[0], cdiv(inter, block))](
            x2, out, x2.stride(0), out.stride(0), inter, BLOCK=block, num_warps=4, **pdl(x2.device, x2.shape[0])
        )
    return out.view(*x.shape[:-1], inter)
