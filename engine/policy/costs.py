"""What a speculative round costs and commits (the adaptive policy, the bench's cost model): expected
committed tokens from per-position acceptance, and a table of measured round ms (`engine.bench profile`
rows) interpolated linearly between batches; a span or batch outside the table is an error, never a guess."""

from __future__ import annotations

import bisect
import csv
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path


def expected_committed(conditional: Sequence[float], drafts: int) -> float:
    """E[tokens a round commits] with `drafts` drafts: 1 (the bonus) + sum over i <= drafts of
    P(drafts 1..i all accepted), where conditional[i-1] = P(draft i accepted | 1..i-1 accepted)."""
    if drafts < 0 or drafts > len(conditional):
        raise ValueError(f"drafts={drafts} outside [0, {len(conditional)}] (the profile's positions)")
    total, p = 1.0, 1.0
    for a in conditional[:drafts]:
        p *= a
        total += p
    return total


@dataclass
class CostTable:
    """verify[(batch, span)] and draft[batch] in ms (graph replays of the speculative engine, whose target
    forward also stores the drafter's context; draft: the LM head over every draft position); heads[(batch,
    K)]: the drafter with its LM head over the first K positions (a round of K drafts), where measured;
    plain[batch]: a plain engine's one-row step (verify span 1 when absent); host_ms(batch) = host_a +
    host_b * batch: per-step host ms the device table misses."""

    verify: dict[tuple[int, int], float]
    draft: dict[int, float] = field(default_factory=dict)
    plain: dict[int, float] = field(default_factory=dict)
    host_a: float = 0.0
    host_b: float = 0.0
    heads: dict[tuple[int, int], float] = field(default_factory=dict)

    @classmethod
    def from_rows(cls, rows: Iterable[dict], plain_rows: Iterable[dict] = ()) -> CostTable:
        """From profile rows (dicts or CSV rows of strings) with kind, batch, span, ms; plain_rows: a
        plain engine's span-1 verify rows."""
        plain = {int(r["batch"]): float(r["ms"]) for r in plain_rows if r["kind"] == "verify" and int(r["span"]) == 1}
        verify, heads = {}, {}
        for r in rows:
            kind, batch, span, ms = r["kind"], int(r["batch"]), int(r["span"]), float(r["ms"])
            if ms <= 0:
                raise ValueError(f"profile row {r}: ms must be > 0")
            if kind == "verify":
                verify[(batch, span)] = ms
            elif kind == "draft":  # span: the draft positions the LM head ran over
                heads[(batch, span)] = ms
            else:
                raise ValueError(f"profile row {r}: unknown kind {kind!r} (verify or draft)")
        if not verify:
            raise ValueError("a cost table needs verify rows")
        full = max((k for _, k in heads), default=0)
        draft = {b: ms for (b, k), ms in heads.items() if k == full}
        return cls(verify, draft, plain, heads={key: ms for key, ms in heads.items() if key[1] != full})

    def spans(self) -> list[int]:
        return sorted({s for _, s in self.verify})

    def batch_range(self, spans: Sequence[int]) -> tuple[int, int]:
        """The batches every one of `spans` and the drafter rows cover: (lowest, highest)."""
        series = [[b for b, s in self.verify if s == span] for span in spans] + [list(self.draft)]
        lo, hi = max(min(xs) for xs in series), min(max(xs) for xs in series)
        if lo > hi:
            raise ValueError(f"the cost table's spans {list(spans)} and drafter rows share no batch range")
        return lo, hi

    def verify_ms(self, batch: int, span: int) -> float:
        points = {b: ms for (b, s), ms in self.verify.items() if s == span}
        if not points:
            raise ValueError(f"span {span} was not profiled (spans {self.spans()})")
        return interpolate(points, batch, f"verify span {span}")

    def draft_ms(self, batch: int, heads: int | None = None) -> float:
        """The drafter forward with its LM head over `heads` positions (None or unmeasured: all)."""
        if not self.draft:
            raise ValueError("no drafter rows in the cost table")
        points = {b: ms for (b, k), ms in self.heads.items() if k == heads}
        if points and min(points) <= batch <= max(points):
            return interpolate(points, batch, f"draft heads {heads}")
        return interpolate(self.draft, batch, "draft")

    def host_ms(self, batch: int) -> float:
        return self.host_a + self.host_b * batch

    def decode_ms(self, batch: int) -> float:
        """One plain engine step: a one-row span per request."""
        if self.plain:
            return interpolate(self.plain, batch, "plain") + self.host_ms(batch)
        return self.gated_ms(batch)

    def gated_ms(self, batch: int) -> float:
        """One gated round: a one-row span per request on the speculative engine (features stored)."""
        return self.verify_ms(batch, 1) + self.host_ms(batch)

    def round_ms(self, batch: int, drafts: int) -> float:
        """One speculative round: the drafter forward plus a verify of 1 + drafts rows per request."""
        return self.draft_ms(batch, drafts) + self.verify_ms(batch, 1 + drafts) + self.host_ms(batch)


def interpolate(points: dict[int, float], x: int, what: str, measured: str = "profiled") -> float:
    """Linear between the measured batches; a batch outside them is an error, never a guess."""
    xs = sorted(points)
    if not xs[0] <= x <= xs[-1]:
        raise ValueError(f"{what}: batch {x} outside the {measured} range {xs[0]}..{xs[-1]}")
    i = bisect.bisect_left(xs, x)
    if xs[i] == x:
        return points[x]
    x0, x1 = xs[i - 1], xs[i]
    return points[x0] + (points[x1] - points[x0]) * (x - x0) / (x1 - x0)


def read_cost_table(path: str | Path) -> CostTable:
    """A cost table from an `engine.bench profile` CSV (columns kind, batch, span, ms at least)."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
        return CostTable.from_rows(rows)
    except (OSError, KeyError, ValueError) as err:
        raise ValueError(f"cost table {str(path)!r}: {type(err).__name__}: {err}") from None
