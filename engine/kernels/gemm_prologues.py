"""The prologue helpers of the projection kernels (gemm.py, gemv.py, gemm_tma.py): the PDL start of
the tl.dot kernels, and the helpers that form one K tile of the activation in registers from what
the previous kernels wrote."""

from __future__ import annotations

from engine.kernels._triton import jit

tl = None  # triton.language, bound by _triton.bind at the first launch


@jit
def _pdl_start(PDL: tl.constexpr, GLU: tl.constexpr):
    """Under PDL, wait for the previous kernel's writes, then let the next kernel launch. After the
    SwiGLU epilogue (GLU) the down projection launches at this kernel's exit instead: launched while
    it streamed, a decode step ran 0.94x at c=8 (decode_ab at cf872c1, H200)."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        if not GLU:
            tl.extra.cuda.gdc_launch_dependents()


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


@jit
def _prologue_tiles(x_rows, r_rows, nw_ptr, up_off, rk, m_ok, k_hi, SWIGLU: tl.constexpr, NORM: tl.constexpr):
    """What the prologue reads for one [BLOCK_M, BLOCK_K] tile (x, then up or r, then nw; a tile
    past k_hi reads nothing): issued a tile ahead by the prefetching tl.dot path (gemm.py)."""
    k_ok = rk < k_hi
    xm = m_ok[:, None] & k_ok[None, :]
    x = tl.load(x_rows + rk[None, :], mask=xm, other=0.0)
    aux = x
    nw = tl.zeros_like(rk).to(x.dtype)
    if SWIGLU:
        aux = tl.load(x_rows + up_off + rk[None, :], mask=xm, other=0.0)
    if NORM:
        aux = tl.load(r_rows + rk[None, :], mask=xm, other=0.0)
        nw = tl.load(nw_ptr + rk, mask=k_ok, other=0.0)
    return x, aux, nw
