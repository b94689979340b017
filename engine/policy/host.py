"""The adaptive policy's host term: the ms a round costs beyond the cost table's device time, learnt
online from the rounds' walls (why each rule: docs/design/policy.md, section 4)."""

from __future__ import annotations

from collections import deque
from statistics import median_low

FIRST_WALLS = 3  # a host term starts from the least of this many walls
WINDOW = 9  # then it is the median of this many latest walls


def _bucket(batch: int) -> int:
    return 1 << max(batch - 1, 0).bit_length()


class HostTerm:
    """ms per (speculative, batch bucket: the power of two at or above the batch) of wall minus the table's
    ms: the least of the first FIRST_WALLS (each capped at the device ms), then the median of the latest
    `window`. Each (K, batch)'s first wall is skipped. Unseen: a gated term 0, a speculative one the gated."""

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
        start = len(walls) < FIRST_WALLS
        walls.append(min(residual, device_ms) if start else residual)
        self.ms[key] = min(walls) if start else median_low(walls)

    def relax(self, batch: int, rate: float) -> None:
        """A policy-gated round: the bucket's speculative term and its walls above the gated term move
        `rate` of the way to it."""
        spec_key, gated = (True, _bucket(batch)), self.ms.get((False, _bucket(batch)))
        spec = self.ms.get(spec_key)
        if spec is not None and gated is not None and spec > gated:
            moved = (w - rate * (w - gated) if w > gated else w for w in self._walls[spec_key])
            self._walls[spec_key] = deque(moved, maxlen=self.window)
            self.ms[spec_key] = spec - rate * (spec - gated)

    def predict(self, batch: int, speculative: bool) -> float:
        """The term at the batch's bucket; a gated one never above the speculative one."""
        gated, spec = self.ms.get((False, _bucket(batch)), 0.0), self.ms.get((True, _bucket(batch)))
        return gated if spec is None else spec if speculative else min(gated, spec)
