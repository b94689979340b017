"""The adaptive span policy (SPEC 9): before each speculative round, choose K drafts to verify.

K is taken from the span variants {0, 1, 2, 4, 8, all} (capped by MAX_DRAFTS; 0 = the gated one-token
round that keeps the capture) to maximise expected committed tokens per millisecond of the batch:
E[committed | K] from a per-position acceptance estimate, the round's time from a cost table
(engine/costs.py) plus the host time the table cannot see. `choose_span` is the pure decision;
`SpanPolicy` keeps the online acceptance estimate (an EMA of conditional acceptance per draft position,
per request-round observed there, seeded optimistic: at 16 requests a round moves it ~20 %, at one
request 1.5 %, so a few unlucky rounds of a lone request no longer gate it), the online host term
(`HostTerm`: each round's measured wall minus the table's device time, per kind of round and batch) and
the hysteresis: K moves only after the best variant beat the current one by `margin` for `patience`
consecutive rounds, or at once when it is ahead by more than `jump`. The hysteresis damps acceptance
noise; a batch or cap that changed under the K in force is no noise (the H200 study's c=256 adaptive arm
held K=15 at batch 256 for three rounds left over from the last drain, 71 ms each). A gated round
observes nothing. Where the estimate itself says 0 even for one request, it relaxes toward its seed
there, so the policy probes again rather than latching at 0; where only the batch's cost says 0, it
stays: the batch draining brings speculation back, and an estimate drifted up by hundreds of gated
rounds would buy 16-row probes at batch 256 (the same study's next run). Yet an estimate that only the
batch's cost gates is never refreshed there, nor the positions past the K in force: when acceptance rose
meanwhile the policy latched (the H200 study at b0194de: `code` c=64 gated 69 % of its rounds on an
estimate left by `chat`, 23 % under trim 8). So one round probes (engine/probe.py) the best larger K
when its value on the estimate is at least PROBE_FLOOR of the K in force's and the rounds since the last
probe took PROBE_FIRST times its expected value loss, doubling up to PROBE_MAX while the probes change
nothing (per batch bucket): the probes give up under 0.3 / 16 of the value (spaced by rounds instead,
8-draft probes at batch 128 cost the `chat` arm ~15 %, ca36d9c), and none runs where more drafts are far
behind (batch 256 on the 4B table: 0.62 of the gated round). While the batch only drains (no request
will come) and speculation is near break-even (WAVE_BAND), K is valued over the whole wave instead of
one round (engine/drain.py); while draining, K moves without patience.
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

SPAN_VARIANTS = (0, 1, 2, 4, 8)  # plus "all": the drafter's drafts per round
# A speculative K must expect this much more than the gated round: its estimate is the optimistic one
# (on the H200 4B study the cost model over-predicted speculative arms at c >= 64, and the policy's
# break-even picks at chat c=64 lost 7 % to plain while the gated round's cost is what it measures).
SPEC_DISCOUNT = 0.05
# A draining wave is valued as a whole only where one round's best K leads the gated round by less than
# this: the wave lowers a speculative K's value against the gated round's (by 7-23 % in the study's
# lockstep cells), never raises it, and one evaluation costs 0.3-0.9 ms of host time (the 2-core dev CPU).
WAVE_BAND = 1.3


class Decision(NamedTuple):
    """A round's K, the policy state it leaves (None: a forced gated round changes none) and whether
    its wall teaches the host term (not a wave's last round: every request finishes in it, and their
    completion, paid once per request whatever K, taught the H200 study's gated term at batch 64 1.8
    ms against ~0.3 a steady round at 54c876b, and `chat` c=64 verified 2 drafts, 11 % under plain)."""

    k: int
    state: tuple | None = None
    teaches: bool = True


def span_candidates(per_round: int, max_drafts: int, table: CostTable) -> list[int]:
    """The K a round may take: the variants up to the cap (MAX_DRAFTS, else all drafts) whose verify
    span 1 + K the table measured."""
    cap = min(per_round, max_drafts) if max_drafts else per_round
    spans = set(table.spans())
    return sorted(k for k in {*SPAN_VARIANTS, cap} if k <= cap and 1 + k in spans)


def round_times(table: CostTable, batch: int, candidates: Sequence[int]) -> dict[int, float]:
    """ms of one round of `batch` requests per candidate K (0: a gated round). Batches outside the
    table's range take its nearest end."""
    lo, hi = table.batch_range([1 + k for k in candidates])
    at = min(max(batch, lo), hi)
    return {k: table.round_ms(at, k) if k else table.gated_ms(at) for k in candidates}


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
        self._times: dict[tuple[int, int], dict[int, float]] = {}  # (batch, max_drafts) -> round_times
        self.host = HostTerm()
        self._device: dict[tuple[int, int], float] = {}  # (batch, K) -> the table's ms
        self.waves = WaveValues(
            lambda b, cap: round_times(table, b, span_candidates(per_round, cap, table)), SPEC_DISCOUNT
        )
        self.learn_host = learn_host  # off: the table is the whole cost (a table given, e.g. a gate's)

    def decide(
        self,
        batch: int,
        max_drafts: int = 0,
        remaining: Sequence[int] | None = None,
        useful: int | None = None,
    ) -> int:
        """K for the next round of `batch` requests: `apply(plan(...))` (arguments: see `plan`)."""
        return self.apply(self.plan(batch, max_drafts, remaining, useful))

    def plan(
        self,
        batch: int,
        max_drafts: int = 0,
        remaining: Sequence[int] | None = None,
        useful: int | None = None,
    ) -> Decision:
        """The next round's decision, changing no state (`apply` takes it): it can be made while the
        device runs the round before. remaining: each request's tokens left, given when no request
        waits for a slot (a draining wave: K valued over the whole wave). useful: the most drafts any
        request may still accept (tokens left minus the bonus): below 1 the gated round, else no K past
        the smallest variant covering it (the best of those), as unacceptable drafts only cost: at
        3cfef9c the H200 study's c=256 waves ended in 8- and 15-draft rounds of one-token stragglers,
        45-70 ms against a 5 ms gated round (-13 to -17 % to plain)."""
        if useful is not None and useful < 1:  # forced: the K in force stays, the wall teaches nothing
            return Decision(0, None, False)
        times = self._round_times(batch, max_drafts)
        draining = remaining is not None and batch > 1
        best, values = best_span(times, batch, self.conditional)
        if draining and best and values[best] < WAVE_BAND * values[0]:  # near break-even: over the wave
            values = self.waves(remaining, max_drafts, self.conditional, self.host.predict)
            best = max(values, key=lambda k: (values[k], -k))
        # A wave's values already average its rounds' acceptance, and a wave is short: each round spent
        # waiting out the patience runs the wrong K over a share of it (H200 study at f53b035: `chat`
        # c=64 kept the last cell's K=4 for its first rounds and lost 13-15 % to plain).
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

    def _round_times(self, batch: int, max_drafts: int) -> dict[int, float]:
        """The table's ms per candidate K plus the host term measured so far."""
        times = self._times.get((batch, max_drafts))
        if times is None:
            candidates = span_candidates(self.per_round, max_drafts, self.table)
            times = self._times[batch, max_drafts] = round_times(self.table, batch, candidates)
        gated, spec = self.host.predict(batch, False), self.host.predict(batch, True)
        return {k: ms + (spec if k else gated) for k, ms in times.items()}

    def observe_wall(self, batch: int, k: int, wall_ms: float) -> None:
        """A decode-side round of `batch` requests at K drafts (0: gated) took `wall_ms` end to end."""
        if not self.learn_host or not self._teaches:
            return
        device = self._device.get((batch, k))
        if device is None:
            device = self._device[batch, k] = round_times(self.table, batch, [k])[k]
        self.host.add(batch, k, wall_ms, device)

    def _starved_at_one(self, max_drafts: int) -> bool:
        """Even one request's round gains no `margin` over the gated round on this estimate. Asked at
        every gated decision, answered again only when its inputs moved (a third of a gated decision's
        host time at batch 256 otherwise)."""
        key = (max_drafts, tuple(self.conditional), self.host.predict(1, False), self.host.predict(1, True))
        if key != self._starved_key:
            best, values = best_span(self._round_times(1, max_drafts), 1, self.conditional)
            self._starved_key, self._starved_answer = key, values[best] <= values[0] * (1.0 + self.margin)
        return self._starved_answer

    def observe(self, limits: Sequence[int], accepted: Sequence[int]) -> None:
        """One speculative round's outcome: per request its draft limit and accepted drafts. Position i
        was tried when i < limit and drafts 1..i were accepted."""
        self.waves.forget()
        tried, hits = [0] * self.per_round, [0] * self.per_round
        for (limit, n), count in Counter(zip(limits, accepted, strict=True)).items():
            for i in range(min(n + 1, limit)):
                tried[i] += count
                hits[i] += count * (i < n)
        for i, t in enumerate(tried):
            if t:  # t samples weigh as t one-sample updates: a lone request's round moves it little
                step = 1.0 - (1.0 - self.ema) ** t
                self.conditional[i] += step * (hits[i] / t - self.conditional[i])

    def gated(self) -> None:
        """A round of K = 0: no acceptance seen; a starved estimate relaxes toward the seed."""
        if self._starved:
            self.conditional = [c + self.relax * (p - c) for c, p in zip(self.conditional, self.prior, strict=True)]
