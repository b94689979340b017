"""The host term of the adaptive policy (engine/policy.py): the ms a round costs beyond the cost
table's device time, learnt online per kind of round and batch bucket from the rounds' walls."""

from __future__ import annotations

from collections import deque
from statistics import median_low

FIRST_WALLS = 3  # a host term starts from the least of this many walls
WINDOW = 9  # then it is the median of this many latest walls


def _bucket(batch: int) -> int:
    return 1 << max(batch - 1, 0).bit_length()


class HostTerm:
    """The ms a round costs beyond the table's device time, per kind (gated or speculative) and batch
    bucket (the power of two at or above the batch): the median of the latest `window` rounds' measured
    wall minus the table's time for it. On a small model the speculative round's host work (settling,
    the scheduler, the trace) outweighs its device time, so a table of graph replays alone speculates at
    a loss. A step that captured a graph never arrives here (the engine drops its wall: on the H200 4B
    study a bucket's captures of batches 40, 48 and 56 taught a 3.2 ms term that gated `code` at c=64,
    where speculation wins by 26 %, ec1e906), nor does the first round of each (K, batch). A term starts
    as the least of its first three walls, each capped at the device time: host time only ever runs long
    (a collection, an allocation), and a kind the policy seldom chooses is learnt from few walls (at
    98faeda the gated term at 128 started at 2.1 ms, nearly three times its later 0.74, and the `code`
    arm verified 4 drafts there, 9.5 % under the gate). Later walls join a window whose median is the
    term: a burst of slow walls shorter than half the window moves it no further than the spread of the
    walls before, and a lasting change (a host-bound round that dwarfs its device time) is learnt in
    half a window. An EMA did not hold: at df8eaef three gated walls at batch 128 ran up to 13.8 ms over
    the table (their median 3.7, against 0.4 over the 58 of the round before), the EMA took the term to
    2.1 ms, and the `code` c=128 arm then verified 4-8 drafts in every round, 20 % under plain. A kind
    never seen at a bucket is not read off other buckets: that misled the policy both ways on the H200
    (scaled by batch, one request's term made a gated round of 16 look 16 times dearer and kept the
    small pair speculating at a loss, 03985b1; on the line through buckets 16 and 32, an unseen
    speculative term at 64 gated the 4B `code` arm at c=64, where speculation wins by 26 %, db862e5). An
    unseen gated term counts 0; an unseen speculative one counts the gated term of its bucket, since its
    host work is a superset (counted 0, the f4464a4 rounds looked level with the gated round on a 4 ms
    gated term)."""

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
        host work is a superset of it: an inflated gated term is not re-learnt while the policy keeps
        speculating (at a8d8ca0 the 4B study's gated term at 128 stood at 3.3 ms for the whole sweep,
        against a speculative 1.5, and the `chat` arm verified 4 drafts at c=128, 27 % under plain)."""
        bucket = _bucket(batch)
        gated, spec = self.ms.get((False, bucket), 0.0), self.ms.get((True, bucket))
        if speculative:
            return gated if spec is None else spec
        return gated if spec is None else min(gated, spec)
