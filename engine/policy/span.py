"""The adaptive span policy: per round the K (drafts to verify; 0 = the gated round) with the most expected
committed tokens per ms of the batch, under hysteresis and probes (why each: docs/design/policy.md)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from functools import cache
from itertools import accumulate
from operator import mul
from pathlib import Path
from typing import Any, NamedTuple

from engine.policy.costs import CostTable, read_cost_table
from engine.policy.host import HostTerm
from engine.policy.wave import WaveValues

CONTEXT_STEP = 64  # tokens: the resolution at which the policy reads the table's context axis
SPAN_VARIANTS = (0, 1, 2, 4, 8)  # plus "all": the drafter's drafts per round
SPEC_DISCOUNT = 0.05  # a speculative K must expect this much more than the gated round: its estimate is optimistic
WAVE_BAND = 1.3  # a draining wave is valued whole only where one round's best K leads the gated round by less
PROBE_FIRST, PROBE_MAX, PROBE_FLOOR = 16, 512, 0.7  # spacing (x a probe's loss) first, last; least value ratio
PROBE_LOSS_LEAST = 0.1  # a probe's expected loss is counted as at least this share of its ms
PROBE_CEILING = 0.9  # out of the gated round, a probe's K must beat it at this acceptance per position
PROBE_WAVE_LEFT = 4  # a probe in a wave needs this many of its spans (1 + K tokens) left to every request


class Decision(NamedTuple):
    """A round's K, the state it leaves (None: a forced gated round), whether its wall teaches."""

    k: int
    state: tuple | None = None
    teaches: bool = True


def round_drafts(drafts_per_round: int, max_drafts: int) -> int:
    """k: the drafts a speculative round verifies, uniform across the batch; max_drafts 0 = no trim."""
    return min(drafts_per_round, max_drafts) if max_drafts else drafts_per_round


def policy_spans(per_round: int) -> list[int]:
    """Verify spans the policy can choose: 1 + K for K in the span variants and all drafts."""
    return sorted({1 + k for k in (*SPAN_VARIANTS, per_round) if k <= per_round})


def span_candidates(per_round: int, max_drafts: int, table: CostTable) -> list[int]:
    """The variants up to the cap (MAX_DRAFTS, else all drafts) whose verify span 1 + K the table measured."""
    measured = set(table.spans())
    return [s - 1 for s in policy_spans(round_drafts(per_round, max_drafts)) if s in measured]


def round_times(table: CostTable, batch: int, ks: Sequence[int], context: float | None = None) -> dict[int, float]:
    """ms per K (0: gated) of a round of `batch` requests (clamped into the table) at mean `context`."""
    at = table.clamp(batch, [1 + k for k in ks])
    return {k: table.round_ms(at, k, context) if k else table.gated_ms(at, context) for k in ks}


def context_bucket(context: float | None) -> int | None:
    """The mean context rounded to CONTEXT_STEP tokens (the policy's cache key)."""
    return None if context is None else CONTEXT_STEP * round(context / CONTEXT_STEP)


def best_span(times: dict[int, float], batch: int, conditional: Sequence[float]) -> tuple[int, dict[int, float]]:
    """The K with the most expected committed tokens per ms (a speculative K's / (1 + SPEC_DISCOUNT); ties:
    the smaller K) and every K's value."""
    committed = list(accumulate(accumulate(conditional, mul), initial=1.0))  # [K] = expected_committed(., K)
    values = {k: batch * committed[k] / ms / (1.0 + SPEC_DISCOUNT if k else 1.0) for k, ms in times.items()}
    return max(values, key=lambda k: (values[k], -k)), values


def resolve_table(source: str | Path | CostTable | None) -> CostTable | None:
    """EngineConfig.cost_table or PEGAINFER_SPEC_COST_TABLE (a profile CSV); None: the engine calibrates."""
    return source if source is None or isinstance(source, CostTable) else read_cost_table(source)


def check_table(table: CostTable) -> None:
    """Refuse a table the policy cannot decide from."""
    if 1 not in table.spans() or not table.draft:
        raise ValueError("the adaptive policy's cost table needs verify rows of span 1 and drafter rows")


def _at_ceiling(k: int) -> float:
    """Expected committed tokens of a K-draft round at PROBE_CEILING acceptance per position."""
    return (1.0 - PROBE_CEILING ** (1 + k)) / (1.0 - PROBE_CEILING)


class SpanPolicy:
    """K per round (`decide`, or `plan` then `apply`), learning from `observe`, `gated` and `observe_wall`.
    ema: a request-round's weight; K moves once the best beat it by `margin` for `patience` rounds, or by
    `jump`; relax / host_relax: a gated round's step of a starved estimate toward `prior` / of the
    speculative host term toward the gated one; learn_host off: the table is the whole cost."""

    def __init__(
        self,
        table: CostTable,
        per_round: int,
        prior: Sequence[float] | None = None,
        ema: float = 0.015,
        margin: float = 0.05,
        patience: int = 3,
        relax: float = 0.01,
        jump: float = 0.25,
        host_relax: float = 0.002,
        learn_host: bool = True,
    ):
        check_table(table)
        self.table, self.per_round = table, per_round
        self.prior = list(prior) if prior is not None else [1.0] * per_round
        if len(self.prior) != per_round or not all(0.0 <= a <= 1.0 for a in self.prior):
            raise ValueError(f"prior {self.prior}: expected {per_round} acceptance rates in [0, 1]")
        self.conditional = list(self.prior)
        self.ema, self.margin, self.patience, self.relax, self.jump = ema, margin, patience, relax, jump
        self.host_relax, self.learn_host, self.host = host_relax, learn_host, HostTerm()
        self.k: int | None = None  # the K in force; None until the first decision
        self.chosen: Counter[int] = Counter()  # rounds per K decided (benches report it)
        self.probed: Counter[tuple[int, int]] = Counter()  # probe rounds per (batch, K) (benches report it)
        self._streak, self._batch, self._teaches, self._starved = 0, 0, True, True  # the last decision's
        self._probes: dict[tuple[int, int], list[float]] = {}  # (batch bucket, K) -> [ms since a probe, spacing]
        self._starved_memo: tuple = (None, True)  # _starved_at_one's inputs and answer
        self._times = cache(lambda b, cap, c: round_times(table, b, span_candidates(per_round, cap, table), c))
        self._device = cache(lambda b, k, c: round_times(table, b, [k], c)[k])
        self.waves = WaveValues(self._times, self.host.predict, SPEC_DISCOUNT)

    def decide(self, *args: Any, **kwargs: Any) -> int:
        """`apply(plan(...))`."""
        return self.apply(self.plan(*args, **kwargs))

    def plan(
        self,
        batch: int,
        max_drafts: int = 0,
        remaining: Sequence[int] | None = None,
        useful: int | None = None,
        context: float | None = None,
    ) -> Decision:
        """The next round's decision, changing no state. remaining: each request's tokens left while the wave
        drains (K valued over it); useful: the most drafts any request may accept (below 1: gated; else K
        at most the smallest variant covering it); context: the batch's mean tokens per request."""
        if useful is not None and useful < 1:  # forced: the K in force stays, the wall teaches nothing
            return Decision(0, None, False)
        context = context_bucket(context)
        times = self._round_times(batch, max_drafts, context)
        draining = remaining is not None and batch > 1
        best, values = best_span(times, batch, self.conditional)
        if draining and best and values[best] < WAVE_BAND * values[0]:  # near break-even: over the wave
            values = self.waves(remaining, max_drafts, self.conditional, context)
            best = max(values, key=lambda k: (values[k], -k))
        patience = 1 if draining else self.patience  # a wave's values already average its rounds
        k_in_force, streak = self.k, self._streak
        if k_in_force not in values:
            k_in_force, streak = best, 0
        elif best != k_in_force and values[best] > values[k_in_force] * (1.0 + self.margin):
            streak += 1
            if streak >= patience or values[best] > values[k_in_force] * (1.0 + self.jump):
                k_in_force, streak = best, 0
        else:
            streak = 0
        starved = k_in_force == 0 and self._starved_at_one(max_drafts)
        restart = k_in_force != self.k and batch == self._batch  # the estimate moved K, not the load
        k, probe = self._probe(batch, k_in_force, starved, restart, times, values, min(remaining) if draining else None)
        if useful is not None:  # this round only: the K in force stays for the next wave
            cover = min((c for c in values if c >= useful), default=max(values))
            if k > cover:
                k = max((c for c in values if c <= cover), key=lambda c: (values[c], -c))
        return Decision(k, (k_in_force, streak, starved, restart, batch, probe))

    def _probe(
        self, batch: int, k_in_force: int, starved: bool, restart: bool, times: dict, values: dict, left: int | None
    ) -> tuple[int, tuple]:
        """This round's K and probe state ((batch bucket, K in force), [ms since a probe, spacing]): the best
        larger K worth PROBE_FLOOR of the K in force's value once the ms since a probe reach the spacing
        times its expected loss (none starved, `left` < PROBE_WAVE_LEFT spans, or it cannot beat K=0)."""
        key = (batch.bit_length(), k_in_force)
        since, spacing = (0.0, PROBE_FIRST) if restart else self._probes.get(key, (0.0, PROBE_FIRST))
        bar = (1.0 + self.margin) * (1.0 + SPEC_DISCOUNT) / times[0] if k_in_force == 0 else 0.0
        larger = {k: v for k, v in values.items() if k > k_in_force and _at_ceiling(k) / times[k] > bar}
        if larger and not starved:
            k = max(larger, key=lambda k: (larger[k], -k))
            late = left is not None and left < PROBE_WAVE_LEFT * (1 + k)
            lead = _at_ceiling(k) / times[k] * times[k_in_force] / _at_ceiling(k_in_force)
            loss = max(1.0 - larger[k] / values[k_in_force], PROBE_LOSS_LEAST) / (1.0 - PROBE_FLOOR)
            loss = loss if lead > 1.0 + self.jump else 1.0
            if since >= spacing * times[k] * loss and not late and larger[k] >= PROBE_FLOOR * values[k_in_force]:
                return k, (key, [0.0, min(2 * spacing, PROBE_MAX)])
        return k_in_force, (key, [since + times[k_in_force], spacing])

    def apply(self, decision: Decision) -> int:
        """Take a decision `plan` made; its K."""
        if decision.state is not None:
            self.k, self._streak, self._starved, restart, batch, (key, probe) = decision.state
            if restart:  # the estimate moved K at this batch: its bucket probes afresh
                self._probes = {key: state for key, state in self._probes.items() if key[0] != batch.bit_length()}
            self._probes[key], self._batch = probe, batch
            if decision.k > self.k:  # above the K in force: a probe
                self.probed[batch, decision.k] += 1
            if self.k == 0:
                self.host.relax(batch, self.host_relax)
        self._teaches = decision.teaches
        self.chosen[decision.k] += 1
        return decision.k

    def _round_times(self, batch: int, max_drafts: int, context: int | None = None) -> dict[int, float]:
        """The table's ms per candidate K plus the host term learnt so far."""
        gated, spec = self.host.predict(batch, False), self.host.predict(batch, True)
        return {k: ms + (spec if k else gated) for k, ms in self._times(batch, max_drafts, context).items()}

    def observe_wall(self, batch: int, k: int, wall_ms: float, context: float | None = None) -> None:
        """A round of `batch` requests at K drafts (0: gated) and mean `context` tokens took `wall_ms`."""
        if self.learn_host and self._teaches:
            self.host.add(batch, k, wall_ms, self._device(batch, k, context_bucket(context)))

    def _starved_at_one(self, max_drafts: int) -> bool:
        """No K gains `margin` over the gated round even for one request (memoised on its inputs)."""
        key = (max_drafts, tuple(self.conditional), self.host.predict(1, False), self.host.predict(1, True))
        if key != self._starved_memo[0]:
            best, values = best_span(self._round_times(1, max_drafts), 1, self.conditional)
            self._starved_memo = key, values[best] <= values[0] * (1.0 + self.margin)
        return self._starved_memo[1]

    def observe(self, limits: Sequence[int], accepted: Sequence[int]) -> None:
        """Per request its draft limit and accepted drafts (position i tried: i < limit, 1..i accepted)."""
        tried, hits = [0] * self.per_round, [0] * self.per_round
        for (limit, n), count in Counter(zip(limits, accepted, strict=True)).items():
            for i in range(min(n + 1, limit)):
                tried[i] += count
                hits[i] += count * (i < n)
        self.observe_counts(tried, hits)

    def observe_counts(self, tried: Sequence[int], hits: Sequence[int]) -> None:
        """A round's request-rounds that tried and accepted each position."""
        self.waves.forget()
        for i, t in enumerate(tried):
            if t:  # t samples weigh as t one-sample updates: a lone request's round moves it little
                step = 1.0 - (1.0 - self.ema) ** t
                self.conditional[i] += step * (hits[i] / t - self.conditional[i])

    def gated(self) -> None:
        """A round of K = 0: no acceptance seen; a starved estimate relaxes toward the prior."""
        if self._starved:
            self.conditional = [c + self.relax * (p - c) for c, p in zip(self.conditional, self.prior, strict=True)]
