"""Timing on the device or the host (CUDA events on the GPU, the host clock on CPU): how long a callable
takes (`time_ms`: the benches, the fixture's build projection) and per-step phase times
(`PhaseTimer`: the engine's steps under a bench)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_ms(
    fn: Callable[[], object], device: torch.device, repeats: int, iters: int = 1, warmup: int = 1
) -> list[float]:
    """Milliseconds per call of fn, one sample per repeat (each the mean over `iters` back-to-back
    calls): CUDA events on the GPU, the host clock after a synchronize on CPU."""
    for _ in range(warmup):
        fn()
    sync(device)
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / iters)
        else:
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            samples.append((time.perf_counter() - t0) * 1e3 / iters)
    return samples


@dataclass
class StepTiming:
    plan: str
    batch: int
    phases: dict[str, float] = field(default_factory=dict)  # ms
    total: float = 0.0  # ms, from step start to the results on the host


class PhaseTimer:
    """start() at the step's start, mark(name) when a phase ends, finish() once results are on the host."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.records: list[StepTiming] = []
        self._marks: list[tuple[str, object]] = []
        self._spans: list[tuple[str, object, object]] = []
        self._wall = 0.0

    def _stamp(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def start(self) -> None:
        self._marks = [("start", self._stamp())]
        self._spans: list[tuple[str, object, object]] = []
        self._wall = time.perf_counter()

    def span(self, phase: str, begin: torch.cuda.Event | None, end: torch.cuda.Event | None) -> None:
        """A phase between two recorded CUDA events, not at this step's marks (a step launched by the
        step before: engine/decode_overlap.py). Without events (CPU) nothing is recorded."""
        if begin is not None and end is not None:
            self._spans.append((phase, begin, end))

    def mark(self, phase: str) -> None:
        self._marks.append((phase, self._stamp()))

    def finish(self, plan: str, batch: int) -> StepTiming:
        if self.cuda:
            self._marks[-1][1].synchronize()
        timing = StepTiming(plan, batch, total=(time.perf_counter() - self._wall) * 1e3)
        for (_, before), (phase, after) in zip(self._marks, self._marks[1:], strict=False):
            ms = before.elapsed_time(after) if self.cuda else (after - before) * 1e3
            timing.phases[phase] = timing.phases.get(phase, 0.0) + ms
        for phase, begin, end in self._spans:
            end.synchronize()
            timing.phases[phase] = timing.phases.get(phase, 0.0) + begin.elapsed_time(end)
        self.records.append(timing)
        return timing
