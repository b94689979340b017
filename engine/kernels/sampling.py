"""Greedy argmax and prefix acceptance."""

from __future__ import annotations

import torch

from engine.kernels._triton import cdiv, jit, next_pow2


def argmax_ref(logits: torch.Tensor) -> torch.Tensor:
    """[M, V] -> int64 [M]; ties resolve to the lowest index."""
    return logits.argmax(dim=-1)


def accept_prefix_ref(drafts: torch.Tensor, targets: torch.Tensor, limits: torch.Tensor) -> torch.Tensor:
    """Longest accepted prefix per row.

    drafts: [N, k] proposed tokens d1..dk; targets: [N, k+1] the target's token at each span
    position; limits: [N] how many drafts of the row may be accepted (<= k).
    Returns int64 [N]: n = number of leading i < limit with drafts[i] == targets[i].
    """
    n_rows, k = drafts.shape
    if k == 0:
        return torch.zeros(n_rows, dtype=torch.int64, device=drafts.device)
    idx = torch.arange(k, device=drafts.device)
    match = (drafts == targets[:, :k]) & (idx[None, :] < limits[:, None])
    return match.to(torch.int64).cumprod(dim=1).sum(dim=1)


# --- Triton ---------------------------------------------------------------------------------
tl = None  # triton.language, bound by _triton.bind at the first launch
# argmax runs in two passes so that one 151936-wide row is read by many programs: pass 1 writes
# each chunk's (max, first index), pass 2 keeps the first chunk holding the row maximum.

ARGMAX_CHUNK = 4096


@jit
def _argmax_partial_kernel(x_ptr, val_ptr, idx_ptr, stride_x, V, NUM_CHUNKS: tl.constexpr, CHUNK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    cols = c * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(x_ptr + row * stride_x + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
    best = tl.max(x, axis=0)
    # First index holding the maximum (a sentinel past V if none: all -inf, handled by pass 2).
    first = tl.min(tl.where((x == best) & (cols < V), cols, V), axis=0)
    tl.store(val_ptr + row * NUM_CHUNKS + c, best)
    tl.store(idx_ptr + row * NUM_CHUNKS + c, first)


@jit
def _argmax_reduce_kernel(val_ptr, idx_ptr, out_ptr, V, NUM_CHUNKS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK)
    ok = c < NUM_CHUNKS
    val = tl.load(val_ptr + row * NUM_CHUNKS + c, mask=ok, other=float("-inf"))
    idx = tl.load(idx_ptr + row * NUM_CHUNKS + c, mask=ok, other=V)
    best = tl.max(val, axis=0)
    first = tl.min(tl.where((val == best) & ok, idx, V), axis=0)
    tl.store(out_ptr + row, tl.where(first < V, first, 0).to(tl.int64))  # all -inf: index 0 like torch


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """Triton `argmax_ref` for [M, V] logits; ties (and all -inf rows) resolve to the lowest index.
    NaN is not treated specially (torch would return the NaN's index)."""
    rows, vocab = logits.shape
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if rows == 0:
        return out
    if vocab == 0:
        raise ValueError("argmax over an empty vocabulary")
    x = logits if logits.stride(-1) == 1 else logits.contiguous()
    chunk = min(ARGMAX_CHUNK, next_pow2(vocab))
    chunks = cdiv(vocab, chunk)
    vals = torch.empty(rows, chunks, dtype=torch.float32, device=x.device)
    idxs = torch.empty(rows, chunks, dtype=torch.int32, device=x.device)
    _argmax_partial_kernel[(rows, chunks)](
        x, vals, idxs, x.stride(0), vocab, NUM_CHUNKS=chunks, CHUNK=chunk, num_warps=8 if chunk >= 2048 else 4
    )
    _argmax_reduce_kernel[(rows,)](vals, idxs, out, vocab, NUM_CHUNKS=chunks, BLOCK=next_pow2(chunks), num_warps=1)
    return out


@jit
def _accept_prefix_kernel(d_ptr, t_ptr, lim_ptr, out_ptr, stride_d, stride_t, k, BLOCK_K: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, BLOCK_K)
    lim = tl.load(lim_ptr + row)
    ok = (i < k) & (i < lim)
    d = tl.load(d_ptr + row * stride_d + i, mask=ok, other=0)
    t = tl.load(t_ptr + row * stride_t + i, mask=ok, other=0)
    # n = first position that is not an accepted match (min(k, limit) when all match).
    n = tl.min(tl.where(ok & (d == t), BLOCK_K, i), axis=0)
    tl.store(out_ptr + row, n.to(tl.int64))


def accept_prefix(drafts: torch.Tensor, targets: torch.Tensor, limits: torch.Tensor) -> torch.Tensor:
    """Triton `accept_prefix_ref`: one program per row."""
    n_rows, k = drafts.shape
    if n_rows == 0 or k == 0:  # a gated round: nothing to accept, no Triton launch on the host
        return torch.zeros(n_rows, dtype=torch.int64, device=drafts.device)
    out = torch.empty(n_rows, dtype=torch.int64, device=drafts.device)
    _accept_prefix_kernel[(n_rows,)](
        drafts,
        targets,
        limits,
        out,
        drafts.stride(0),
        targets.stride(0),
        k,
        BLOCK_K=max(2, next_pow2(k)),
        num_warps=1,
    )
    return out
