"""How the kernel micro-benchmark times an op (a CUDA graph of back-to-back calls over rotated data
copies, or triton's do_bench) and which candidates count (those that matched the reference)."""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Callable

import torch

from engine.kernels.split_sum import dense
from engine.kernels.tuning import SkinnyConfig
from engine.timing import time_ms

# (impl, config or None, microseconds per call): one timed path of a sweep.
Result = tuple[str, SkinnyConfig | None, float]


class Timer:
    def __init__(self, kind: str):
        self.kind = kind

    def __call__(self, fn: Callable[[int], object], variants: int, est_us: float) -> float:
        """Median microseconds per call of fn(i), i cycling over `variants` data copies."""
        if self.kind == "do_bench":
            import triton.testing

            counter = iter(range(1 << 62))
            return 1e3 * triton.testing.do_bench(
                lambda: fn(next(counter) % variants), warmup=5, rep=25, return_mode="median"
            )
        calls = max(variants, min(200, math.ceil(300.0 / max(est_us, 0.5))))
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for i in range(min(variants, 3)):
                fn(i)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(calls):
                fn(i % variants)
        times = time_ms(graph.replay, torch.device("cuda"), repeats=7)
        del graph
        return 1e3 * statistics.median(times) / calls


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def time_candidate(
    timer: Timer, fn: Callable[[int], torch.Tensor], ref: torch.Tensor, copies: int, est: float, label: str
) -> float | None:
    """Microseconds per call of fn, or None (reported) if it does not compile, fit or match ref (a
    deferred split-K result is summed for the check only: the timed call leaves it to its consumer)."""
    try:
        err = rel_err(dense(fn(0)), ref)
        if not err < 2e-2:
            raise RuntimeError(f"wrong result (rel err {err:.2e})")
        return timer(fn, copies, est)
    except Exception as e:  # a config that does not compile or fit is reported, not fatal
        print(f"  skip {label}: {str(e).splitlines()[0][:120] if str(e) else type(e).__name__}", file=sys.stderr)
        return None


def time_paths(
    timer: Timer,
    paths: list[tuple[str, SkinnyConfig | None, Callable[[int], torch.Tensor], str]],
    ref: torch.Tensor,
    copies: int,
    est: float,
) -> list[Result]:
    """(impl, config, us) of every (impl, config, fn, label) path that ran and matched ref, in order."""
    results = []
    for impl, cfg, fn, label in paths:
        us = time_candidate(timer, fn, ref, copies, est, label)
        if us is not None:
            results.append((impl, cfg, us))
    return results


def unfused_vs_fused(results: list[Result]) -> tuple[Result | None, Result | None]:
    """The fastest unfused path and the fastest fused config (None where none ran)."""
    base = min((r for r in results if r[0] != "fused"), key=lambda r: r[2], default=None)
    fused = min((r for r in results if r[0] == "fused"), key=lambda r: r[2], default=None)
    return base, fused
