"""A split-K projection's output: its fp32 partials `[splits, M, N]` (`SplitSum`), and the
deterministic reduce kernel that sums them in split order and rounds them to the output dtype.

A one-row split-K projection whose output is only added to the residual stream (o, SwiGLU->down)
may hand back its partials unsummed (gemm.launch(defer=True)): the next add + RMSNorm (the NORM
prologue of the next projection, or norm.add_rms_norm: the final norm) sums them as the reduce
kernel would, so the reduce launch and its kernel boundary go away and every result stays
bit-identical."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.kernels._triton import cdiv, jit, pdl

tl = None  # triton.language, bound by _triton.bind at the first launch


@jit
def _splitk_reduce_kernel(p_ptr, y_ptr, M, N, stride_ym, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    if PDL:  # wait for the previous kernel's writes, then let the next kernel launch
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = idx < M * N
    acc = tl.zeros([BLOCK], tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(p_ptr + s * M * N + idx, mask=ok, other=0.0)
    tl.store(y_ptr + (idx // N) * stride_ym + idx % N, acc.to(y_ptr.dtype.element_ty), mask=ok)


def reduce_parts(parts: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """y = the sum of parts [splits, M, N] over splits, in split order, rounded to y's dtype."""
    split_k, m, n = parts.shape
    block = 1024
    _splitk_reduce_kernel[(cdiv(m * n, block),)](
        parts, y, m, n, y.stride(0), SPLIT_K=split_k, BLOCK=block, num_warps=4, **pdl(parts.device, m)
    )
    return y


@dataclass(frozen=True)
class SplitSum:
    """A projection's output as its fp32 split-K partials [splits, M, N], not yet summed; `dtype` is
    the output's. Only the add + RMSNorm consumers take it (fused_linear.add_rms_norm_linear,
    norm.add_rms_norm); anything else calls dense()."""

    parts: torch.Tensor
    dtype: torch.dtype

    @property
    def shape(self) -> torch.Size:
        return self.parts.shape[1:]

    @property
    def device(self) -> torch.device:
        return self.parts.device

    def tensor(self) -> torch.Tensor:
        """The summed output, as the reduce kernel writes it."""
        _, m, n = self.parts.shape
        return reduce_parts(self.parts, torch.empty(m, n, dtype=self.dtype, device=self.parts.device))


def dense(x: torch.Tensor | SplitSum) -> torch.Tensor:
    return x.tensor() if isinstance(x, SplitSum) else x
