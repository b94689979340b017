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


def _stamp(cuda: bool) -> torch.cuda.Event | float:
    """A CUDA event recorded now (on the GPU), else the host clock."""
    if not cuda:
        return time.perf_counter()
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def _ms(begin: torch.cuda.Event | float, end: torch.cuda.Event | float) -> float:
    return (end - begin) * 1e3 if isinstance(begin, float) else begin.elapsed_time(end)


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
        start = _stamp(device.type == "cuda")
        for _ in range(iters):
            fn()
        end = _stamp(device.type == "cuda")
        if not isinstance(end, float):
            end.synchronize()
        samples.append(_ms(start, end) / iters)
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

    def start(self) -> None:
        self._marks = [("start", _stamp(self.cuda))]
        self._spans = []
        self._wall = time.perf_counter()

    def span(self, phase: str, begin: torch.cuda.Event | None, end: torch.cuda.Event | None) -> None:
        """A phase between two recorded CUDA events, not at this step's marks (a step launched by the
        step before: engine/decode_overlap.py). Without events (CPU) nothing is recorded."""
        if begin is not None and end is not None:
            self._spans.append((phase, begin, end))

    def mark(self, phase: str) -> None:
        self._marks.append((phase, _stamp(self.cuda)))

    def finish(self, plan: str, batch: int) -> StepTiming:
        if self.cuda:
            self._marks[-1][1].synchronize()
        timing = StepTiming(plan, batch, total=(time.perf_counter() - self._wall) * 1e3)
        marked = [(phase, begin, end) for (_, begin), (phase, end) in zip(self._marks, self._marks[1:], strict=False)]
        for phase, begin, end in marked + self._spans:
            if self.cuda:
                end.synchronize()
            timing.phases[phase] = timing.phases.get(phase, 0.0) + _ms(begin, end)
        self.records.append(timing)
        return timing
