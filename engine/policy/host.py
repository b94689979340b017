"""The adaptive policy's host term: the ms a round costs beyond the cost table's device time, learnt
online per kind of round and batch bucket from the rounds' walls (docs/design/policy.md)."""

from __future__ import annotations

from collections import deque
from statistics import median_low

FIRST_WALLS = 3  # a host term starts from the least of this many walls
WINDOW = 9  # then it is the median of this many latest walls


def _bucket(batch: int) -> int:
    return 1 << max(batch - 1, 0).bit_length()


class HostTerm:
    """The ms a round costs beyond the table's device time, per kind (gated or speculative) and batch
    bucket (the power of two at or above the batch): the least of its first FIRST_WALLS walls (each
    capped at the device time), then the median of the latest `window`; a wall is the round's measured
    ms minus the table's. The first wall of each (K, batch) is skipped (one-off costs); the engine sends
    none of a step that captured a graph. No bucket is read off another: an unseen gated term counts 0,
    an unseen speculative one the gated term of its bucket (its host work is a superset)."""

    def __init__(self, window: int = WINDOW):
        self.window = window
        self.ms: dict[tuple[bool, int], float] = {}  # (speculative, bucket) -> host ms
        self._seen: set[tuple[int, int]] = set()  # (K, batch) whose first wall was skipped
        self._walls: dict[tuple[bool, int], deque[float]] = {}  # the walls a term is the median of
        self.log: list[tuple[bool, int, float]] | None = None  # a bench's record of the walls taken

    def add(self, batch: int, k: int, wall_ms: float, device_ms: float) -> None:
        if (k, batch) not in self._seen:  # a new shape's first round pays one-off costs (allocations)
            self._seen.add((k, batch))
            return
        key = (k > 0, _bucket(batch))
        residual = max(wall_ms - device_ms, 0.0)  # a wall under the table's time says nothing of the host
        if self.log is not None:
            self.log.append((*key, residual))
        walls = self._walls.setdefault(key, deque(maxlen=self.window))
        if len(walls) < FIRST_WALLS:  # a robust start: the least of the first walls, each capped
            walls.append(min(residual, device_ms))
            self.ms[key] = min(walls)
            return
        walls.append(residual)
        self.ms[key] = median_low(walls)

    def relax(self, batch: int, rate: float) -> None:
        """A policy-gated round: the speculative term at this bucket moves toward the gated one (each
        of its walls above it does, so the median moves by `rate` of the gap), so a term that slow
        walls inflated is probed again rather than latching the policy at 0."""
        spec_key, gated_key = (True, _bucket(batch)), (False, _bucket(batch))
        spec, gated = self.ms.get(spec_key), self.ms.get(gated_key)
        if spec is not None and gated is not None and spec > gated:
            moved = [w - rate * (w - gated) if w > gated else w for w in self._walls[spec_key]]
            self._walls[spec_key] = deque(moved, maxlen=self.window)
            self.ms[spec_key] = spec - rate * (spec - gated)

    def predict(self, batch: int, speculative: bool) -> float:
        """The term at the batch's bucket; a gated round's never above the speculative round's, whose
        host work is a superset of it (an inflated gated term is not re-learnt while speculating)."""
        bucket = _bucket(batch)
        gated, spec = self.ms.get((False, bucket), 0.0), self.ms.get((True, bucket))
        if speculative:
            return gated if spec is None else spec
        return gated if spec is None else min(gated, spec)
