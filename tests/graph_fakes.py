"""A CPU stand-in for CUDA graph capture: StepGraphs whose capture keeps the step's static inputs and
replays it eagerly on them, so the real keying, padding, freezing and capture counts run on the CPU."""

from __future__ import annotations

from engine.graphs import StepGraphs


class StaticStep:
    """A capture's stand-in: the step's static inputs, refilled and run eagerly at each replay."""

    def __init__(self, fn, inputs):
        self.fn, self.inputs = fn, inputs

    def replay(self, **values):
        for name, value in values.items():
            if value.data_ptr() != self.inputs[name].data_ptr():
                self.inputs[name].copy_(value)
        return self.fn(**self.inputs)


class CPUGraphs(StepGraphs):
    def __init__(self, buckets: list[int]):
        super().__init__(False, buckets)
        self.enabled = True

    def capture(self, fn, inputs):
        return StaticStep(fn, inputs)
