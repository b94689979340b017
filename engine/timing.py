"""Per-step phase times for benchmarks: device-side (CUDA events) on GPU, host clock on CPU."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch


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
        self._wall = 0.0

    def _stamp(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def start(self) -> None:
        self._marks = [("start", self._stamp())]
        self._wall = time.perf_counter()

    def mark(self, phase: str) -> None:
        self._marks.append((phase, self._stamp()))

    def finish(self, plan: str, batch: int) -> StepTiming:
        if self.cuda:
            self._marks[-1][1].synchronize()
        timing = StepTiming(plan, batch, total=(time.perf_counter() - self._wall) * 1e3)
        for (_, before), (phase, after) in zip(self._marks, self._marks[1:], strict=False):
            ms = before.elapsed_time(after) if self.cuda else (after - before) * 1e3
            timing.phases[phase] = timing.phases.get(phase, 0.0) + ms
        self.records.append(timing)
        return timing
