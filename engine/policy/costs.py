"""What a speculative round costs and commits (the adaptive policy, the bench's cost model): expected
committed tokens from per-position acceptance, and a table of measured round ms (`engine.bench profile`
rows) interpolated linearly between batches; a span or batch outside the table is an error, never a guess.
Context: the table's rows are timed at `context` tokens per request; rows timed at longer contexts give
each (kind, span) the ms one more token of context costs one request (its KV read), so a round at mean
context c costs the table's ms plus kv_ms * batch * (c - context)."""

from __future__ import annotations

import bisect
import csv
import statistics
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
    context: int = 0  # tokens in each request's cache when the table's rows were timed
    kv_ms: dict[tuple[str, int], float] = field(default_factory=dict)  # (kind, span) -> ms per request-token

    @classmethod
    def from_rows(cls, rows: Iterable[dict], plain_rows: Iterable[dict] = ()) -> CostTable:
        """From profile rows (dicts or CSV rows of strings) with kind, batch, span, ms and optionally
        context (tokens per request: the least is the table's, longer ones fit kv_ms); plain_rows: a plain
        engine's span-1 verify rows."""
        rows = list(rows)
        contexts = [int(r.get("context") or 0) for r in rows]
        base = min(contexts, default=0)
        longer = [(r, c) for r, c in zip(rows, contexts, strict=True) if c > base]
        rows = [r for r, c in zip(rows, contexts, strict=True) if c == base]
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
        table = cls(verify, draft, plain, heads={key: ms for key, ms in heads.items() if key[1] != full}, context=base)
        table.kv_ms = _kv_slopes(table, longer)
        return table

    def spans(self) -> list[int]:
        return sorted({s for _, s in self.verify})

    def batch_range(self, spans: Sequence[int]) -> tuple[int, int]:
        """The batches every one of `spans` and the drafter rows cover: (lowest, highest)."""
        series = [[b for b, s in self.verify if s == span] for span in spans] + [list(self.draft)]
        lo, hi = max(min(xs) for xs in series), min(max(xs) for xs in series)
        if lo > hi:
            raise ValueError(f"the cost table's spans {list(spans)} and drafter rows share no batch range")
        return lo, hi

    def verify_ms(self, batch: int, span: int, context: float | None = None) -> float:
        points = {b: ms for (b, s), ms in self.verify.items() if s == span}
        if not points:
            raise ValueError(f"span {span} was not profiled (spans {self.spans()})")
        return interpolate(points, batch, f"verify span {span}") + self.kv_extra("verify", span, batch, context)

    def draft_ms(self, batch: int, heads: int | None = None, context: float | None = None) -> float:
        """The drafter forward with its LM head over `heads` positions (None or unmeasured: all)."""
        if not self.draft:
            raise ValueError("no drafter rows in the cost table")
        extra = self.kv_extra("draft", 0, batch, context)
        points = {b: ms for (b, k), ms in self.heads.items() if k == heads}
        if points and min(points) <= batch <= max(points):
            return interpolate(points, batch, f"draft heads {heads}") + extra
        return interpolate(self.draft, batch, "draft") + extra

    def kv_extra(self, kind: str, span: int, batch: int, context: float | None) -> float:
        """ms a step of `batch` requests at mean `context` tokens costs past the table's context (a span
        without its own slope takes the nearest measured span's: the KV read is per request)."""
        spans = [s for k, s in self.kv_ms if k == kind]
        if context is None or context <= self.context or not spans:
            return 0.0
        nearest = min(spans, key=lambda s: (abs(s - span), s))
        return self.kv_ms[kind, nearest] * batch * (context - self.context)

    def host_ms(self, batch: int) -> float:
        return self.host_a + self.host_b * batch

    def decode_ms(self, batch: int, context: float | None = None) -> float:
        """One plain engine step: a one-row span per request."""
        if self.plain:
            extra = self.kv_extra("verify", 1, batch, context)
            return interpolate(self.plain, batch, "plain") + extra + self.host_ms(batch)
        return self.gated_ms(batch, context)

    def gated_ms(self, batch: int, context: float | None = None) -> float:
        """One gated round: a one-row span per request on the speculative engine (features stored)."""
        return self.verify_ms(batch, 1, context) + self.host_ms(batch)

    def round_ms(self, batch: int, drafts: int, context: float | None = None) -> float:
        """One speculative round: the drafter forward plus a verify of 1 + drafts rows per request."""
        device = self.draft_ms(batch, drafts, context) + self.verify_ms(batch, 1 + drafts, context)
        return device + self.host_ms(batch)


def _kv_slopes(table: CostTable, longer: list[tuple[dict, int]]) -> dict[tuple[str, int], float]:
    """Per (kind, span): the median over rows timed at a longer context of (their ms - the table's ms at
    their batch) / (batch * extra tokens), at least 0; the drafter's under span 0 (any head count)."""
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
            rows = list(csv.DictReader(f))
        return CostTable.from_rows(rows)
    except (OSError, KeyError, ValueError) as err:
        raise ValueError(f"cost table {str(path)!r}: {type(err).__name__}: {err}") from None
