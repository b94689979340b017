"""A cost model of speculative decoding: committed tokens from per-position acceptance, round time from
a measured cost table (`engine.bench profile`: verify ms per (batch, span), drafter ms per batch).

    table = CostTable.from_rows(read_csv(Path("profile.csv")))
    tok_s = steady_tok_s(table, batch=64, drafts=4, conditional=profile.conditional)

Batches between measured points are interpolated linearly; a span or batch outside the table is an
error, never a guess.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


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


def committed_pmf(conditional: Sequence[float], drafts: int) -> list[float]:
    """pmf[n] = P(exactly n of `drafts` drafts accepted), n = 0..drafts."""
    pmf, p = [], 1.0
    for a in conditional[:drafts]:
        pmf.append(p * (1.0 - a))
        p *= a
    return [*pmf, p]


def truncated_tau(conditional: Sequence[float], drafts: int, tokens: int) -> float:
    """Committed tokens per round over a request whose rounds produce `tokens` tokens, each round's
    accepted drafts capped at the tokens left minus the bonus (the engine's draft limit): the ratio
    of expectations tokens / E[rounds], by dynamic programming over the tokens left."""
    if tokens < 1:
        raise ValueError(f"tokens={tokens}: must be >= 1")
    pmf = committed_pmf(conditional, drafts)
    rounds = [0.0] * (tokens + 1)
    for left in range(1, tokens + 1):
        cap = max(0, min(drafts, left - 1))
        expected = 1.0
        for n, p in enumerate(pmf):
            expected += p * rounds[left - 1 - min(n, cap)]
        rounds[left] = expected
    return tokens / rounds[tokens]


@dataclass
class CostTable:
    """verify[(batch, span)] and draft[batch] in ms (graph replays of the speculative engine, whose
    target forward also stores the drafter's context); plain[batch]: a plain engine's one-row step
    (verify span 1 when absent); host_ms(batch) = host_a + host_b * batch is the per-step host time
    the device table does not see (0 unless calibrated)."""

    verify: dict[tuple[int, int], float]
    draft: dict[int, float] = field(default_factory=dict)
    plain: dict[int, float] = field(default_factory=dict)
    host_a: float = 0.0
    host_b: float = 0.0

    @classmethod
    def from_rows(cls, rows: Iterable[dict], plain_rows: Iterable[dict] = ()) -> CostTable:
        """From profile rows (dicts or CSV rows of strings) with kind, batch, span, ms; plain_rows: a
        plain engine's span-1 verify rows."""
        plain = {int(r["batch"]): float(r["ms"]) for r in plain_rows if r["kind"] == "verify" and int(r["span"]) == 1}
        verify, draft = {}, {}
        for r in rows:
            kind, batch, span, ms = r["kind"], int(r["batch"]), int(r["span"]), float(r["ms"])
            if ms <= 0:
                raise ValueError(f"profile row {r}: ms must be > 0")
            if kind == "verify":
                verify[(batch, span)] = ms
            elif kind == "draft":
                draft[batch] = ms
            else:
                raise ValueError(f"profile row {r}: unknown kind {kind!r} (verify or draft)")
        if not verify:
            raise ValueError("a cost table needs verify rows")
        return cls(verify, draft, plain)

    def spans(self) -> list[int]:
        return sorted({s for _, s in self.verify})

    def verify_ms(self, batch: int, span: int) -> float:
        points = {b: ms for (b, s), ms in self.verify.items() if s == span}
        if not points:
            raise ValueError(f"span {span} was not profiled (spans {self.spans()})")
        return _interpolate(points, batch, f"verify span {span}")

    def draft_ms(self, batch: int) -> float:
        if not self.draft:
            raise ValueError("no drafter rows in the cost table")
        return _interpolate(self.draft, batch, "draft")

    def host_ms(self, batch: int) -> float:
        return self.host_a + self.host_b * batch

    def decode_ms(self, batch: int) -> float:
        """One plain engine step: a one-row span per request."""
        if self.plain:
            return _interpolate(self.plain, batch, "plain") + self.host_ms(batch)
        return self.gated_ms(batch)

    def gated_ms(self, batch: int) -> float:
        """One gated round: a one-row span per request on the speculative engine (features stored)."""
        return self.verify_ms(batch, 1) + self.host_ms(batch)

    def round_ms(self, batch: int, drafts: int) -> float:
        """One speculative round: the drafter forward plus a verify of 1 + drafts rows per request."""
        return self.draft_ms(batch) + self.verify_ms(batch, 1 + drafts) + self.host_ms(batch)


def _interpolate(points: dict[int, float], x: int, what: str) -> float:
    xs = sorted(points)
    if not xs[0] <= x <= xs[-1]:
        raise ValueError(f"{what}: batch {x} outside the profiled range {xs[0]}..{xs[-1]}")
    i = bisect.bisect_left(xs, x)
    if xs[i] == x:
        return points[x]
    x0, x1 = xs[i - 1], xs[i]
    return points[x0] + (points[x1] - points[x0]) * (x - x0) / (x1 - x0)


def steady_tok_s(
    table: CostTable, batch: int, drafts: int | None, conditional: Sequence[float] = (), gate: int = 0
) -> float:
    """Output tokens/s of `batch` requests decoding in lockstep, no prefill or drain: drafts None is
    plain decode; a gate at or under the batch runs gated rounds (plain steps)."""
    if drafts is None:
        return 1e3 * batch / table.decode_ms(batch)
    if gate and batch >= gate:
        return 1e3 * batch / table.gated_ms(batch)
    return 1e3 * batch * expected_committed(conditional, drafts) / table.round_ms(batch, drafts)


def best_arm(predicted: dict[str, float]) -> str:
    """The arm with the highest predicted tok/s (ties: the first given)."""
    return max(predicted, key=lambda arm: predicted[arm])
