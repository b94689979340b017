"""A split-K projection's output: its fp32 partials `[splits, M, N]` (`SplitSum`), the deterministic
reduce kernel that sums them in split order and rounds them to the output dtype, and the same sum
inside the projection's own launch (`_split_store`, SELF_REDUCE).

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
# The tl.dot and TMA projections sum their own split-K partials: each program stores its split's tile,
# then takes a ticket on that tile's counter, and the program with the last ticket sums the tile's
# splits in split order (bit-identical to the reduce kernel) and resets the counter for the next
# launch. False: the reduce kernel (the A/B's before).
SELF_REDUCE = True
COUNTER_SLOTS = 4096  # output tiles a self-reducing launch may have; a larger grid uses the reduce kernel
_counters: dict[torch.device, torch.Tensor] = {}


def tile_counters(device: torch.device, tiles: int) -> torch.Tensor | None:
    """The device's zeroed int32 ticket counters for a self-reducing launch of `tiles` output tiles,
    or None where it cannot have them: SELF_REDUCE off, too many tiles, or a first call inside a CUDA
    graph capture (a buffer allocated there is zeroed only when the graph replays). Every launch
    leaves them zero, and launches on one stream never overlap past their PDL wait."""
    if not SELF_REDUCE or tiles > COUNTER_SLOTS:
        return None
    counters = _counters.get(device)
    if counters is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        counters = _counters[device] = torch.zeros(COUNTER_SLOTS, dtype=torch.int32, device=device)
    return counters


@jit
def _split_store(acc, p_ptr, y_ptr, c_ptr, part_off, y_off, mask, M, N, REDUCE: tl.constexpr):
    """Store this program's split-K tile `acc` (fp32, at part_off in its [M, N] plane of p); with
    REDUCE, the program that stores a tile's last split (ticket on c[tile]) sums the tile's planes in
    split order from zero, as _splitk_reduce_kernel does, stores them rounded at y_off in y, and
    zeroes the counter. Grid (N tiles, M tiles, splits)."""
    splits = tl.num_programs(2)
    plane = tl.cast(M, tl.int64) * N
    tl.store(p_ptr + tl.program_id(2) * plane + part_off, acc, mask=mask)
    if REDUCE:
        tl.debug_barrier()  # every thread's partials are stored before the ticket releases them
        tile = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
        if tl.atomic_add(c_ptr + tile, 1, sem="acq_rel", scope="gpu") == splits - 1:
            total = tl.zeros_like(acc)
            for s in range(splits):  # .cg: from L2, where the other programs' stores are
                total += tl.load(p_ptr + s * plane + part_off, mask=mask, other=0.0, cache_modifier=".cg")
            tl.store(y_ptr + y_off, total.to(y_ptr.dtype.element_ty), mask=mask)
            tl.store(c_ptr + tile, 0)


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
        parts, y, m, n, y.stride(0), SPLIT_K=split_k, BLOCK=block, num_warps=4, **pdl(parts.device)
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
