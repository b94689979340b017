"""The span choice a round calls (engine/round.py): the static levers or the adaptive policy behind the same
calls in round order: `choose` (this round's K; 0 = a gated round, which keeps the capture), `launched` (its
forwards are on the device), `settled` (its outcome; None: a plain decode step), `wall` (the step's ms);
`gates_next`: whether a one-token round's successor may launch ahead (gated too)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.levers import Levers
from engine.policy.budget import RequestAcceptance, budget_spans, request_caps, span_costs
from engine.policy.costs import CostTable
from engine.policy.span import Decision, SpanPolicy, context_bucket
from engine.request import Request


def round_drafts(drafts_per_round: int, max_drafts: int) -> int:
    """k: the drafts a speculative round verifies, uniform across the batch; max_drafts 0 = no trim."""
    return min(drafts_per_round, max_drafts) if max_drafts else drafts_per_round


def mean_context(reqs: Sequence[Request]) -> float:
    """Tokens in each request's cache, on average: the cost table's context axis."""
    return sum(r.num_kv for r in reqs) / len(reqs)


def ahead_key(levers: Levers, draining: bool) -> tuple[int, int, bool]:
    return levers.max_drafts, levers.max_batch, draining


class StaticSpans:
    """K = the drafter's drafts per round, trimmed by MAX_DRAFTS."""

    policy: SpanPolicy | None = None
    per_request = False

    def __init__(self, per_round: int):
        self.per_round = per_round

    def choose(self, reqs: list[Request], levers: Levers, draining: bool) -> int:
        return round_drafts(self.per_round, levers.max_drafts)

    def launched(self, *args: object) -> None:
        """Nothing to learn: `settled` and `wall` alike."""

    settled = wall = launched

    def gates_next(self, reqs: list[Request]) -> bool:
        return True


@dataclass(frozen=True)
class Ahead:
    """A decision for the next round made while the device ran this one, under `key` (ahead_key): for
    exactly `reqs`, or (not exact) any batch of their power-of-two bucket (HostTerm's); `context`: the mean
    context it was decided at."""

    reqs: list[Request]
    key: tuple[int, int, bool]
    decision: Decision
    exact: bool = True
    context: float | None = None

    def holds_for(self, reqs: list[Request], key: tuple[int, int, bool]) -> bool:
        if key != self.key:
            return False
        return reqs == self.reqs if self.exact else (len(reqs) - 1).bit_length() == (len(self.reqs) - 1).bit_length()


class AdaptiveSpans:
    """K per round from the policy, its host work off the critical path: once a round is launched the policy
    takes the round before's outcome and plans the next round's K (`Ahead`, on an estimate one round late).
    per_request (policy=budget): K_i per request under one verify budget (engine/policy/budget.py)."""

    def __init__(self, policy: SpanPolicy):
        self.policy, self.per_request = policy, False
        self.ahead: Ahead | None = None
        self.requests = RequestAcceptance(policy.per_round)
        self._costs: dict[tuple, tuple] = {}  # (batch, context bucket) -> span_costs
        self._device = 0.0  # per request: the device ms the table gives the last round chosen
        self._slots: tuple[list[Request] | None, object] = (None, None)  # the requests chosen for, their rows
        self._unobserved: tuple[Sequence[int], Sequence[int]] | None = None  # the last round's limits, accepted
        self._k: int | None = None  # the K of the last round, until its wall arrives
        self._context: float | None = None  # the mean context its decision read

    def set_table(self, table: CostTable) -> None:
        """A table measured on this device: the host term is learnt, the acceptance estimate kept."""
        self.ahead, self._costs = None, {}
        self.flush()
        conditional, self.policy = self.policy.conditional, SpanPolicy(table, self.policy.per_round)
        self.policy.conditional = list(conditional)

    def choose(self, reqs: list[Request], levers: Levers, draining: bool) -> int | list[int]:
        """The plan made for this round where it holds, else a decision in turn (every outcome observed);
        per request: K_i each (an int where all are equal)."""
        if self.per_request:
            return self._per_request(reqs, levers)
        ahead, self.ahead = self.ahead, None
        if ahead is not None and ahead.holds_for(reqs, ahead_key(levers, draining)):
            self._context = ahead.context
            return self.policy.apply(ahead.decision)
        self.flush()
        remaining = [r.remaining for r in reqs]  # one pass over the requests: each costs at batch 256
        self._context = mean_context(reqs)
        return self.policy.decide(
            len(reqs), levers.max_drafts, remaining if draining else None, max(remaining) - 1, self._context
        )

    def _per_request(self, reqs: list[Request], levers: Levers) -> int | list[int]:
        self.flush()
        p, n = self.policy, len(reqs)
        self._context = mean_context(reqs)
        key = (n, context_bucket(self._context))
        if key not in self._costs:
            self._costs[key] = span_costs(p.table, n, p.per_round, key[1])
        caps = request_caps([r.remaining for r in reqs], p.per_round, levers.max_drafts)
        self._slots = (reqs, self.requests.slots(reqs, p.conditional))
        host, survival = (p.host.predict(n, False), p.host.predict(n, True)), self.requests.survival(self._slots[1])
        ks, self._device = budget_spans(p.table, survival, caps, key[1], host, levers.max_batch, self._costs[key])
        p.chosen[max(ks)] += 1
        return ks[0] if min(ks) == max(ks) else ks

    def launched(self, reqs: list[Request], levers: Levers, draining: bool, limits: Sequence[int] | None) -> None:
        """limits: the verify's draft limits; None for a gated round the policy chose, whose next batch is
        this one less those it finishes. After a verify the next round is planned only where no request's
        budget can cap its K."""
        self.flush()
        if self.per_request:
            return
        if limits is None:
            if nxt := [r for r in reqs if r.remaining > 1]:
                remaining = [r.remaining - 1 for r in nxt]
                self._plan(nxt, levers, draining, remaining, max(remaining) - 1, exact=True)
            return
        useful = max(r.remaining - 1 - limit for r, limit in zip(reqs, limits, strict=True)) - 1
        if useful >= min(levers.max_drafts or self.policy.per_round, self.policy.per_round):  # the largest K
            self._plan(reqs, levers, draining, [r.remaining - 1 for r in reqs], useful, exact=False)

    def _plan(self, reqs: list[Request], levers: Levers, draining: bool, remaining, useful: int, exact: bool) -> None:
        context = mean_context(reqs) + 1  # at least one token committed meanwhile
        decision = self.policy.plan(len(reqs), levers.max_drafts, remaining if draining else None, useful, context)
        self.ahead = Ahead(list(reqs), ahead_key(levers, draining), decision, exact, context)

    def settled(
        self, k: int | None, reqs: Sequence[Request], limits: Sequence[int] = (), accepted: Sequence[int] = ()
    ) -> None:
        """k None: a plain decode step (nothing to learn); 0: a gated round (nothing observed; its context
        read here); else per request its draft limit and accepted drafts, fed to the policy at the next
        launch or decision (per request: now, each request's estimate and the pooled one)."""
        self._k = k
        if self.per_request and k is not None:  # 0: nothing tried, each estimate relaxes toward the pool
            self._observe(reqs, limits if k else [0] * len(reqs), accepted if k else [0] * len(reqs))
        if k and not self.per_request:
            self._unobserved = (limits, accepted)
        elif k == 0:
            self.flush()
            self.policy.gated()
            self._context = mean_context(reqs)

    def _observe(self, reqs: Sequence[Request], limits: Sequence[int], accepted: Sequence[int]) -> None:
        chosen, slots = self._slots
        if chosen is not reqs:
            slots = self.requests.slots(reqs, self.policy.conditional)
        self.policy.observe_counts(*self.requests.observe(slots, limits, accepted, self.policy.conditional))

    def flush(self) -> None:
        """The last speculative round's outcome, now."""
        if self._unobserved is not None:
            self.policy.observe(*self._unobserved)
            self._unobserved = None

    def wall(self, batch: int, ms: float | None) -> None:
        """The wall of the step that ran the last round (None: it captured a graph, or ran no round)."""
        k, self._k = self._k, None
        if k is not None and ms is not None:
            if not (k and self.per_request):
                self.policy.observe_wall(batch, k, ms, self._context)
            elif self.policy.learn_host:  # its K_i: no uniform span of the table
                self.policy.host.add(batch, k, ms, self._device)

    def gates_next(self, reqs: list[Request]) -> bool:
        """Whether the plan made for the next round is a gated round of exactly these requests."""
        a = self.ahead
        return a is not None and a.exact and a.decision.k == 0 and a.reqs == reqs
