"""The adaptive span policy: before each speculative round, choose K, the drafts to verify.

K is the span variant in {0, 1, 2, 4, 8, all} (capped by MAX_DRAFTS; 0 = the gated one-token round, which
keeps the capture) with the most expected committed tokens per ms of the batch: E[committed | K] from a
per-position acceptance estimate (an EMA per request-round, seeded optimistic), ms from the cost table plus
the learnt host term (engine/policy/host.py), under hysteresis, with probes (engine/policy/probe.py) and,
while a wave only drains, K valued over the whole wave (engine/policy/wave.py). Why each mechanism is
there, with the measurements behind it: docs/design/policy.md.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from itertools import accumulate
from operator import mul
from pathlib import Path
from typing import NamedTuple

from engine.policy.costs import CostTable, read_cost_table
from engine.policy.host import HostTerm
from engine.policy.probe import choose_probe
from engine.policy.wave import WaveValues

CONTEXT_STEP = 64  # tokens: the resolution at which the policy reads the table's context axis
SPAN_VARIANTS = (0, 1, 2, 4, 8)  # plus "all": the drafter's drafts per round
SPEC_DISCOUNT = 0.05  # a speculative K must expect this much more than the gated round: its estimate is optimistic
WAVE_BAND = 1.3  # a draining wave is valued whole only where one round's best K leads the gated round by less


class Decision(NamedTuple):
    """A round's K, the policy state it leaves (None: a forced gated round changes none) and whether
    its wall teaches the host term (not a wave's last round, whose requests all finish in it)."""

    k: int
    state: tuple | None = None
    teaches: bool = True


def span_candidates(per_round: int, max_drafts: int, table: CostTable) -> list[int]:
    """The K a round may take: the variants up to the cap (MAX_DRAFTS, else all drafts) whose verify
    span 1 + K the table measured."""
    cap = min(per_round, max_drafts) if max_drafts else per_round
    spans = set(table.spans())
    return sorted(k for k in {*SPAN_VARIANTS, cap} if k <= cap and 1 + k in spans)


def round_times(
    table: CostTable, batch: int, candidates: Sequence[int], context: float | None = None
) -> dict[int, float]:
    """ms of one round of `batch` requests at mean `context` tokens per candidate K (0: a gated round).
    Batches outside the table's range take its nearest end."""
    lo, hi = table.batch_range([1 + k for k in candidates])
    at = min(max(batch, lo), hi)
    return {k: table.round_ms(at, k, context) if k else table.gated_ms(at, context) for k in candidates}


def context_bucket(context: float | None) -> int | None:
    """The batch's mean context rounded to CONTEXT_STEP tokens: the policy's caches are keyed on it."""
    return None if context is None else CONTEXT_STEP * round(context / CONTEXT_STEP)


def choose_span(
    table: CostTable, batch: int, conditional: Sequence[float], candidates: Sequence[int]
) -> tuple[int, dict[int, float]]:
    """The K with the highest expected committed tokens per ms (ties: the smaller K) and every
    candidate's value."""
    return best_span(round_times(table, batch, candidates), batch, conditional)


def best_span(times: dict[int, float], batch: int, conditional: Sequence[float]) -> tuple[int, dict[int, float]]:
    """The best K and every K's value: expected committed tokens per ms, a speculative K's discounted
    by SPEC_DISCOUNT."""
    committed = list(accumulate(accumulate(conditional, mul), initial=1.0))  # [K] = expected_committed(., K)
    values = {k: batch * committed[k] / ms / (1.0 + SPEC_DISCOUNT if k else 1.0) for k, ms in times.items()}
    return max(values, key=lambda k: (values[k], -k)), values


def resolve_table(source: str | Path | CostTable | None) -> CostTable | None:
    """The adaptive policy's cost table from EngineConfig.cost_table or PEGAINFER_SPEC_COST_TABLE (an
    `engine.bench profile` CSV); None when neither is given (the engine then calibrates one)."""
    if source is None or isinstance(source, CostTable):
        return source
    return read_cost_table(source)


def check_table(table: CostTable) -> None:
    """Refuse a table the policy cannot decide from."""
    if 1 not in table.spans() or not table.draft:
        raise ValueError("the adaptive policy's cost table needs verify rows of span 1 and drafter rows")


class SpanPolicy:
    """K per round (`decide`, or `plan` then `apply`), learning from `observe`, `gated` and `observe_wall`.
    ema: an estimate's weight per request-round; K moves once the best beat it by `margin` for `patience`
    rounds, at once when ahead by `jump`; relax: a starved estimate's step toward `prior` per gated round."""

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
        self.host_relax = host_relax  # slow: each probe of a host-bound batch costs a few dear rounds
        self.k: int | None = None  # the K in force; None until the first decision
        self.chosen: Counter[int] = Counter()  # rounds per K decided (benches report it)
        self.probed: Counter[tuple[int, int]] = Counter()  # probe rounds per (batch, K) (benches report it)
        self._streak = 0
        self._probes: dict[tuple[int, int], list[float]] = {}  # (batch bucket, K) -> [ms since a probe, spacing]
        self._batch = 0  # the last decision's batch
        self._teaches = True  # the last decision's round teaches the host term
        self._starved = True  # until a decision says otherwise: a gated round before any relaxes
        self._starved_key: tuple | None = None  # _starved_at_one's inputs at its last answer
        self._starved_answer = True
        self._times: dict[tuple, dict[int, float]] = {}  # (batch, max_drafts, context bucket) -> round_times
        self.host = HostTerm()
        self._device: dict[tuple, float] = {}  # (batch, K, context bucket) -> the table's ms
        self.waves = WaveValues(
            lambda b, cap, c: round_times(table, b, span_candidates(per_round, cap, table), c), SPEC_DISCOUNT
        )
        self.learn_host = learn_host  # off: the table is the whole cost (a table given, e.g. a gate's)

    def decide(
        self,
        batch: int,
        max_drafts: int = 0,
        remaining: Sequence[int] | None = None,
        useful: int | None = None,
        context: float | None = None,
    ) -> int:
        """K for the next round of `batch` requests: `apply(plan(...))` (arguments: see `plan`)."""
        return self.apply(self.plan(batch, max_drafts, remaining, useful, context))

    def plan(
        self,
        batch: int,
        max_drafts: int = 0,
        remaining: Sequence[int] | None = None,
        useful: int | None = None,
        context: float | None = None,
    ) -> Decision:
        """The next round's decision, changing no state (`apply` takes it), so it can be made while the
        device runs the round before. remaining: each request's tokens left, given when no request waits
        for a slot (a draining wave: K valued over the whole wave). useful: the most drafts any request
        may still accept (tokens left minus the bonus): below 1 the gated round, else no K past the
        smallest variant covering it (the best of those)."""
        if useful is not None and useful < 1:  # forced: the K in force stays, the wall teaches nothing
            return Decision(0, None, False)
        context = context_bucket(context)
        times = self._round_times(batch, max_drafts, context)
        draining = remaining is not None and batch > 1
        best, values = best_span(times, batch, self.conditional)
        if draining and best and values[best] < WAVE_BAND * values[0]:  # near break-even: over the wave
            values = self.waves(remaining, max_drafts, self.conditional, self.host.predict, context)
            best = max(values, key=lambda k: (values[k], -k))
        # A wave is short, its values already averaged over its rounds: a draining K moves at once.
        patience = 1 if draining else self.patience
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
        probes = self._probes if not restart else {}
        gated_bar = (1.0 + self.margin) * (1.0 + SPEC_DISCOUNT) / times[0] if k_in_force == 0 else 0.0
        k, probe = choose_probe(
            probes,
            batch,
            k_in_force,
            starved,
            times,
            values,
            min(remaining) if draining else None,
            gated_bar,
            self.jump,
        )
        if useful is not None:  # this round only: the K in force stays for the next wave
            cover = min((c for c in values if c >= useful), default=max(values))
            if k > cover:
                k = max((c for c in values if c <= cover), key=lambda c: (values[c], -c))
        return Decision(k, (k_in_force, streak, starved, restart, batch, probe))

    def apply(self, decision: Decision) -> int:
        """Take a decision `plan` made: the K in force, the hysteresis and the probe spacing move to
        it. Returns this round's K."""
        if decision.state is not None:
            self.k, self._streak, self._starved, restart, batch, (key, probe) = decision.state
            if restart:  # the estimate moved K at this batch: its bucket probes afresh
                self._probes = {key: state for key, state in self._probes.items() if key[0] != batch.bit_length()}
            self._probes[key] = probe
            self._batch = batch
            if decision.k > self.k:  # above the K in force: a probe
                self.probed[batch, decision.k] += 1
            if self.k == 0:
                self.host.relax(batch, self.host_relax)
        self._teaches = decision.teaches
        self.chosen[decision.k] += 1
        return decision.k

    def _round_times(self, batch: int, max_drafts: int, context: int | None = None) -> dict[int, float]:
        """The table's ms per candidate K plus the host term measured so far."""
        times = self._times.get((batch, max_drafts, context))
        if times is None:
            candidates = span_candidates(self.per_round, max_drafts, self.table)
            times = self._times[batch, max_drafts, context] = round_times(self.table, batch, candidates, context)
        gated, spec = self.host.predict(batch, False), self.host.predict(batch, True)
        return {k: ms + (spec if k else gated) for k, ms in times.items()}

    def observe_wall(self, batch: int, k: int, wall_ms: float, context: float | None = None) -> None:
        """A decode-side round of `batch` requests at K drafts (0: gated) and mean `context` tokens took
        `wall_ms` end to end."""
        if not self.learn_host or not self._teaches:
            return
        key = (batch, k, context_bucket(context))
        device = self._device.get(key)
        if device is None:
            device = self._device[key] = round_times(self.table, batch, [k], key[2])[k]
        self.host.add(batch, k, wall_ms, device)

    def _starved_at_one(self, max_drafts: int) -> bool:
        """Even one request's round gains no `margin` over the gated round on this estimate (answered
        again only when its inputs moved)."""
        key = (max_drafts, tuple(self.conditional), self.host.predict(1, False), self.host.predict(1, True))
        if key != self._starved_key:
            best, values = best_span(self._round_times(1, max_drafts), 1, self.conditional)
            self._starved_key, self._starved_answer = key, values[best] <= values[0] * (1.0 + self.margin)
        return self._starved_answer

    def observe(self, limits: Sequence[int], accepted: Sequence[int]) -> None:
        """One speculative round's outcome: per request its draft limit and accepted drafts. Position i
        was tried when i < limit and drafts 1..i were accepted."""
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
        """A round of K = 0: no acceptance seen; a starved estimate relaxes toward the seed."""
        if self._starved:
            self.conditional = [c + self.relax * (p - c) for c, p in zip(self.conditional, self.prior, strict=True)]
