"""What a speculative round commits (from per-position acceptance) and costs: the table of measured ms
(`engine.bench profile` rows), linear between batches, plus kv_ms * batch * (c - context) at mean context c;
a span or batch outside it is an error, never a guess (docs/design/policy.md, sections 8 and 9)."""

from __future__ import annotations

import bisect
import csv
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import accumulate
from operator import mul
from pathlib import Path


def expected_committed(conditional: Sequence[float], drafts: int) -> float:
    """E[tokens a round of `drafts` drafts commits]: 1 + sum over i <= drafts of P(drafts 1..i accepted),
    conditional[i-1] = P(draft i accepted | 1..i-1 accepted)."""
    if drafts < 0 or drafts > len(conditional):
        raise ValueError(f"drafts={drafts} outside [0, {len(conditional)}] (the profile's positions)")
    return sum(accumulate(conditional[:drafts], mul), 1.0)


@dataclass
class CostTable:
    """ms of the speculative engine's graph replays: verify[(batch, span)], draft[batch] (the LM head over
    every draft position), heads[(batch, K)] (over the first K, where measured); plain[batch]: a plain
    engine's one-row step."""

    verify: dict[tuple[int, int], float]
    draft: dict[int, float] = field(default_factory=dict)
    plain: dict[int, float] = field(default_factory=dict)
    heads: dict[tuple[int, int], float] = field(default_factory=dict)
    context: int = 0  # tokens in each request's cache when the table's rows were timed
    kv_ms: dict[tuple[str, int], float] = field(default_factory=dict)  # (kind, span) -> ms per request-token
    full_heads: int = 0  # the head count of `draft` (0: unknown)

    @classmethod
    def from_rows(cls, rows: Iterable[dict], plain_rows: Iterable[dict] = ()) -> CostTable:
        """From profile rows (dicts or CSV rows of strings: kind, batch, span, ms, optionally context: the
        least is the table's, longer ones fit kv_ms); plain_rows: a plain engine's span-1 verify rows."""
        rows = [(r, int(r.get("context") or 0)) for r in rows]
        base = min((c for _, c in rows), default=0)
        plain = {int(r["batch"]): float(r["ms"]) for r in plain_rows if r["kind"] == "verify" and int(r["span"]) == 1}
        verify, heads = {}, {}
        for r in (r for r, c in rows if c == base):
            kind, key, ms = r["kind"], (int(r["batch"]), int(r["span"])), float(r["ms"])
            if ms <= 0:
                raise ValueError(f"profile row {r}: ms must be > 0")
            if kind not in ("verify", "draft"):
                raise ValueError(f"profile row {r}: unknown kind {kind!r} (verify or draft)")
            (verify if kind == "verify" else heads)[key] = ms  # a draft's span: the positions its LM head ran
        if not verify:
            raise ValueError("a cost table needs verify rows")
        full = max((k for _, k in heads), default=0)
        draft = {b: ms for (b, k), ms in heads.items() if k == full}
        heads = {key: ms for key, ms in heads.items() if key[1] != full}
        table = cls(verify, draft, plain, heads=heads, context=base, full_heads=full)
        table.kv_ms = _kv_slopes(table, [(r, c) for r, c in rows if c > base])
        return table

    def spans(self) -> list[int]:
        return sorted({s for _, s in self.verify})

    def clamp(self, batch: int, spans: Sequence[int]) -> int:
        """`batch`, or the nearest end of the batches every one of `spans` and the drafter rows cover."""
        series = [[b for b, s in self.verify if s == span] for span in spans] + [list(self.draft)]
        lo, hi = max(min(xs) for xs in series), min(max(xs) for xs in series)
        if lo > hi:
            raise ValueError(f"the cost table's spans {list(spans)} and drafter rows share no batch range")
        return min(max(batch, lo), hi)

    def verify_ms(self, batch: int, span: int, context: float | None = None) -> float:
        points = {b: ms for (b, s), ms in self.verify.items() if s == span}
        if not points:
            raise ValueError(f"span {span} was not profiled (spans {self.spans()})")
        return interpolate(points, batch, f"verify span {span}") + self.kv_extra("verify", span, batch, context)

    def draft_ms(self, batch: int, heads: int | None = None, context: float | None = None) -> float:
        """The drafter forward with its LM head over `heads` positions: a measured count's ms, a count
        between two measured ones (the full head at `full_heads`) linear between them; None, or below every
        measured count: all."""
        if not self.draft:
            raise ValueError("no drafter rows in the cost table")
        extra, full = self.kv_extra("draft", 0, batch, context), interpolate(self.draft, batch, "draft")
        timed = {  # head count -> ms at this batch, where its rows cover the batch
            k: interpolate(points, batch, f"draft heads {k}")
            for k, points in self.head_points.items()
            if min(points) <= batch <= max(points)
        }
        if heads in timed:
            return timed[heads] + extra
        if heads is None or heads >= self.full_heads:
            return full + extra
        below = max((h for h in timed if h < heads), default=None)
        if below is None:
            return full + extra
        above = min((h for h in timed if h > heads), default=self.full_heads)
        lo, hi = timed[below], timed.get(above, full)
        return lo + (hi - lo) * (heads - below) / (above - below) + extra

    @cached_property
    def head_points(self) -> dict[int, dict[int, float]]:
        """heads, by head count: {batch: ms}."""
        out: dict[int, dict[int, float]] = {}
        for (b, k), ms in self.heads.items():
            out.setdefault(k, {})[b] = ms
        return out

    def kv_extra(self, kind: str, span: int, batch: int, context: float | None) -> float:
        """ms past the table's context for `batch` requests at mean `context` tokens (a span without a slope
        of its own takes the nearest measured span's)."""
        spans = [s for k, s in self.kv_ms if k == kind]
        if context is None or context <= self.context or not spans:
            return 0.0
        nearest = min(spans, key=lambda s: (abs(s - span), s))
        return self.kv_ms[kind, nearest] * batch * (context - self.context)

    def decode_ms(self, batch: int, context: float | None = None) -> float:
        """One plain engine step (the gated round where the table has no plain rows)."""
        if not self.plain:
            return self.gated_ms(batch, context)
        return interpolate(self.plain, batch, "plain") + self.kv_extra("verify", 1, batch, context)

    def gated_ms(self, batch: int, context: float | None = None) -> float:
        """One gated round: a one-row span per request on the speculative engine."""
        return self.verify_ms(batch, 1, context)

    def round_ms(self, batch: int, drafts: int, context: float | None = None) -> float:
        """One speculative round: the drafter forward plus a verify of 1 + drafts rows per request."""
        return self.draft_ms(batch, drafts, context) + self.verify_ms(batch, 1 + drafts, context)


def _kv_slopes(table: CostTable, longer: list[tuple[dict, int]]) -> dict[tuple[str, int], float]:
    """Per (kind, span; the drafter's under span 0): the median over rows at a longer context of (their ms -
    the table's) / (batch * extra tokens), at least 0."""
    slopes: dict[tuple[str, int], list[float]] = {}
    for r, context in longer:
        kind, batch, span, ms = r["kind"], int(r["batch"]), int(r["span"]), float(r["ms"])
        try:
            base = table.verify_ms(batch, span) if kind == "verify" else table.draft_ms(batch, span)
        except ValueError:  # a batch or span the table did not time at its own context
            continue
        key = (kind, span if kind == "verify" else 0)
        slopes.setdefault(key, []).append((ms - base) / (batch * (context - table.context)))
    return {key: max(0.0, statistics.median(xs)) for key, xs in slopes.items()}


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
            return CostTable.from_rows(list(csv.DictReader(f)))
    except (OSError, KeyError, ValueError) as err:
        raise ValueError(f"cost table {str(path)!r}: {type(err).__name__}: {err}") from None
