"""The two measured ceilings (copy bandwidth, GEMM rate) and the peak-memory probe, timed with
engine/timing.py's `time_ms` (host clocks on CPU)."""

from __future__ import annotations

import statistics

import torch

from engine.timing import time_ms


def copy_bandwidth(device: torch.device, nbytes: int = 2 << 30, repeats: int = 10) -> float:
    """Bytes/s of a large device-to-device copy, counting bytes read + bytes written (median).
    Random data, never zeros (METHOD.md: zeros can run faster than real data)."""
    n = nbytes // 2
    src = torch.randn(n, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    ms = statistics.median(time_ms(lambda: dst.copy_(src), device, repeats, warmup=2))
    return 2 * (n * 2) / (ms * 1e-3)


def gemm_rate(device: torch.device, n: int = 8192, dtype: torch.dtype | None = None, repeats: int = 10) -> float:
    """FLOP/s of an n x n x n matrix product through torch (cuBLAS on the GPU), median of repeats."""
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    out = torch.empty(n, n, dtype=dtype, device=device)
    ms = statistics.median(time_ms(lambda: torch.matmul(a, b, out=out), device, repeats, warmup=2))
    return 2 * n**3 / (ms * 1e-3)


def peak_memory_gib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
