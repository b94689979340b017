"""Python's cyclic GC under the benches' timed loops.

A full (generation 2) collection walks every tracked object of the process: ~350k in a study process
(torch, the engine, transformers' Qwen3 module), ~0.5 s on a CI core. One landing inside a timed run
adds a pause unrelated to the arm, and which run pays it depends on allocation history, not on the
arm. `frozen_heap` moves the start-up heap out of the collector's reach for a sweep (gc.freeze, as
vLLM does after start-up): a full collection then walks only what the sweep made since, and a run's
collections cost what serving's would on a frozen heap; `settle_heap` freezes, between runs, what the
runs before left. `GcWatch` records what collections a run paid, so a sweep row can show it.
"""

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
    runs before left (a sweep's own records: ~100k objects over the 4B study's 486 runs). Without it
    those records grew the walked heap, and the full collections that landed in runs took 127-189 ms,
    2-8 per study on the H200: a third of a 0.5 s c=256 run, in whichever arm it fell (at 41ea9ba one
    cost the adaptive arm its `code` c=256 round, -11 % against the gate arm). A run's collections then
    walk what it allocates, as serving's would on a heap frozen after start-up."""
    gc.collect(1)
    if gc.get_freeze_count():
        gc.freeze()


class GcWatch:
    """Collections (count and ms, per generation) while entered, from gc.callbacks."""

    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.ms = [0.0, 0.0, 0.0]
        self._start = 0.0

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
