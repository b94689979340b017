"""CUDA graphs for uniform steps: one per (step kind, shape, batch bucket), replayed only for exactly that
shape; inputs padded to the bucket with the caller's values, `shared` ones captured as they are
(docs/design/engine.md)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

log = logging.getLogger(__name__)


def batch_buckets(max_rows: int) -> list[int]:
    sizes = [b for b in (1, 2, 4, 8) if b < max_rows] + list(range(16, max_rows, 8))
    return sorted(set(sizes + [max_rows]))


class CapturedStep:
    """One captured step: static inputs are copied in, the graph replayed, static outputs read."""

    def __init__(self, fn: Callable[..., tuple], inputs: dict[str, torch.Tensor], pool):
        self.inputs = inputs
        fn(**inputs)  # compiles and autotunes kernels outside the capture
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.outputs = fn(**inputs)

    def replay(self, **values: torch.Tensor) -> tuple:
        for name, value in values.items():
            static = self.inputs[name]
            if value.data_ptr() != static.data_ptr():  # a buffer captured as is needs no copy
                static.copy_(value, non_blocking=True)
        self.graph.replay()
        return self.outputs


class StepGraphs:
    def __init__(self, enabled: bool, buckets: list[int]):
        self.enabled, self.buckets = enabled, buckets
        self.captured: dict[tuple, CapturedStep] = {}
        self.captures = 0  # graphs captured so far: a step that captured one is no timing sample
        self.policy_captured = False  # every graph the adaptive policy replays (engine/policy/warmup.py)
        self.frozen = False  # serving: a step without its graph runs eagerly instead of capturing one
        self.eager_misses = 0  # steps run eagerly while frozen
        self._pool = torch.cuda.graph_pool_handle() if enabled else None

    def bucket(self, n: int) -> int | None:
        """The graph bucket a step of n row groups runs at (None: eager)."""
        if not self.enabled:
            return None
        return next((b for b in self.buckets if b >= n), None)

    def rows(self, n: int) -> int:
        """Rows a step of n row groups runs at: its bucket, or n when eager."""
        return self.bucket(n) or n

    def run(
        self,
        key: tuple,
        fn: Callable[..., tuple],
        n: int,
        values: dict[str, torch.Tensor],
        pads: dict[str, int],
        shared: frozenset[str] = frozenset(),
    ) -> tuple:
        """fn(**values) eagerly, or the graph captured for exactly (key, bucket(n)); frozen, a missing graph
        runs eagerly on the padded inputs instead of being captured."""
        bucket = self.bucket(n)
        if bucket is None:
            return fn(**values)
        values = {k: v if k in shared or v.shape[0] == bucket else _pad(v, bucket, pads[k]) for k, v in values.items()}
        key = (*key, bucket)
        graph = self.captured.get(key)
        if graph is None and self.frozen:
            self.eager_misses += 1
            return fn(**values)
        if graph is None:
            log.debug("capturing CUDA graph %s", key)
            inputs = {k: v if k in shared else v.clone() for k, v in values.items()}
            graph = self.captured[key] = self.capture(fn, inputs)
            self.captures += 1
        return graph.replay(**values)

    def capture(self, fn: Callable[..., tuple], inputs: dict[str, torch.Tensor]) -> CapturedStep:
        return CapturedStep(fn, inputs, self._pool)


def _pad(v: torch.Tensor, rows: int, value: int) -> torch.Tensor:
    fill = torch.full((rows - v.shape[0], *v.shape[1:]), value, dtype=v.dtype, device=v.device)
    return torch.cat([v, fill])
