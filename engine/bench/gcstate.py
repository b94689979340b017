"""Python's cyclic GC under the benches' timed loops: `frozen_heap` keeps the start-up heap out of
the collector's reach for a sweep, `settle_heap` freezes between runs what the runs before left, and
`GcWatch` records the collections a run paid (why: the benchmarks README, "sweep")."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Collect, then freeze every surviving object until exit. A heap already frozen (an outer
    frozen_heap, or a process policy) is left as it is: gc.unfreeze would thaw the outer one too."""
    if gc.get_freeze_count():
        yield
        return
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def settle_heap() -> None:
    """Before a timed run: collect the young generations; inside a frozen_heap, also freeze what the
    runs before left."""
    gc.collect(1)
    if gc.get_freeze_count():
        gc.freeze()


class GcWatch:
    """Collections (count and ms, per generation) while entered, from gc.callbacks."""

    def __init__(self) -> None:
        self.count, self.ms, self._start = [0, 0, 0], [0.0, 0.0, 0.0], 0.0

    @property
    def total_ms(self) -> float:
        return sum(self.ms)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
            return
        gen = info["generation"]
        self.count[gen] += 1
        self.ms[gen] += (time.perf_counter() - self._start) * 1e3

    def __enter__(self) -> GcWatch:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)
