"""The prologue helpers of the projection kernels (gemm.py, gemv.py): each forms one K tile of the
activation in registers from what the previous kernels wrote."""

from __future__ import annotations

from engine.kernels._triton import jit

tl = None  # triton.language, bound by _triton.bind at the first launch


@jit
def _swiglu(gate, up):
    """silu(gate) * up, rounded as silu_and_mul_ref (and _silu_and_mul_kernel) round: silu in the
    input dtype, then the product in the input dtype."""
    g = gate.to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(gate.dtype).to(tl.float32)
    return (act * up.to(tl.float32)).to(gate.dtype)


@jit
def _add_scale(x, r, nw):
    """One tile of the NORM prologue: (s, s * nw) with s = x + r, both rounded to the input dtype as
    add_rms_norm_ref rounds the sum; the row's 1/rms is applied to the accumulator at the end."""
    s = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
    return s, (s.to(tl.float32) * nw.to(tl.float32)).to(x.dtype)
