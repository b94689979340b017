"""The span choice a round calls (engine/round.py), static or adaptive: `configure` (the levers), then in
round order `choose` (K; 0 = gated), `launched`, `settled` (its outcome), `wall` (the step's ms); `next_k`:
the next round's K where known now (else 0); `gates_next`: may a successor launch ahead."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from operator import attrgetter

from engine.levers import Levers
from engine.policy.budget import RequestAcceptance, budget_spans, request_caps, span_costs
from engine.policy.costs import CostTable
from engine.policy.span import Decision, SpanPolicy, context_bucket, round_drafts
from engine.request import Request


def mean_context(reqs: Sequence[Request]) -> float:
    """Tokens in each request's cache, on average: the cost table's context axis."""
    return sum(map(attrgetter("num_kv"), reqs)) / len(reqs)  # the same int sum, no generator frame


class StaticSpans:
    """K = the drafter's drafts per round, trimmed by MAX_DRAFTS."""

    policy: SpanPolicy | None = None

    def __init__(self, per_round: int):
        self.per_round, self.levers = per_round, Levers()

    def configure(self, levers: Levers) -> None:
        self.levers = levers

    def choose(self, reqs: list[Request], draining: bool) -> int:
        return round_drafts(self.per_round, self.levers.max_drafts)

    next_k = choose

    def launched(self, *args: object) -> None:
        """Nothing to learn: `settled` and `wall` alike."""

    settled = wall = launched

    def gates_next(self, reqs: list[Request]) -> bool:
        return True


@dataclass(frozen=True)
class Ahead:
    """A decision for the next round made while the device ran this one, for a `draining` wave or not, at
    mean `context`: for exactly `reqs`, or (not exact) any batch of their power-of-two bucket."""

    reqs: list[Request]
    draining: bool
    decision: Decision
    exact: bool = True
    context: float | None = None
    device: float = 0.0  # policy=budget: the device ms its table gives the planned round

    def holds_for(self, reqs: list[Request], draining: bool) -> bool:
        if draining != self.draining:
            return False
        return reqs == self.reqs if self.exact else (len(reqs) - 1).bit_length() == (len(self.reqs) - 1).bit_length()


class AdaptiveSpans:
    """K per round from the policy, its host work off the critical path: once a round is launched the policy
    takes the round before's outcome and plans the next round's K (`Ahead`, on an estimate one round late).
    per_request (policy=budget): K_i per request under one verify budget (engine/policy/budget.py)."""

    def __init__(self, policy: SpanPolicy):
        self.policy, self.per_request, self.levers = policy, False, Levers()
        self.ahead: Ahead | None = None
        self.requests = RequestAcceptance(policy.per_round)
        self.padded = False  # under CUDA graphs a ragged verify runs at a ragged span's rows (Rounds sets it)
        self._costs = cache(lambda n, ctx: span_costs(self.policy.table, n, self.policy.per_round, ctx, self.padded))
        self._device = 0.0  # per request: the device ms the table gives the last round chosen
        self._slots: tuple[list[Request] | None, object] = (None, None)  # the requests chosen for, their rows
        self._unobserved: tuple[Sequence[int], Sequence[int]] | None = None  # the last round's limits, accepted
        self._k: int | None = None  # the K of the last round, until its wall arrives
        self._context: float | None = None  # the mean context its decision read

    def configure(self, levers: Levers) -> None:
        """Levers in force from now: a plan made under others is dropped."""
        self.levers, self.ahead, self.per_request = levers, None, levers.policy == "budget"

    def set_table(self, table: CostTable) -> None:
        """A table measured on this device: the host term is learnt, the acceptance estimate kept."""
        self.ahead = None
        self._costs.cache_clear()
        self.flush()
        conditional, self.policy = self.policy.conditional, SpanPolicy(table, self.policy.per_round)
        self.policy.conditional = list(conditional)

    def choose(self, reqs: list[Request], draining: bool) -> int | list[int]:
        """The plan made for this round where it holds, else a decision in turn (every outcome observed);
        per request: K_i each (an int where all are equal)."""
        ahead, self.ahead = self.ahead, None
        ahead = ahead if ahead is not None and ahead.holds_for(reqs, draining) else None
        if self.per_request:
            return self._per_request(reqs, ahead)
        if ahead is not None:
            self._context = ahead.context
            return self.policy.apply(ahead.decision)
        self.flush()
        remaining = [r.remaining for r in reqs]  # one pass over the requests: each costs at batch 256
        self._context, wave = mean_context(reqs), remaining if draining else None
        return self.policy.decide(len(reqs), self.levers.max_drafts, wave, max(remaining) - 1, self._context)

    def next_k(self, reqs: list[Request], draining: bool) -> int:
        a = self.ahead
        return a.decision.k if a is not None and a.holds_for(reqs, draining) else 0

    def _per_request(self, reqs: list[Request], ahead: Ahead | None) -> int | list[int]:
        """K_i in turn, or the uniform K planned for exactly these requests (`_budget_ahead`)."""
        if ahead is not None:
            self._context, self._slots, self._device = ahead.context, (None, None), ahead.device
            self.policy.chosen[ahead.decision.k] += 1
            return ahead.decision.k
        self.flush()
        self._context = mean_context(reqs)
        slots, (ks, self._device) = self._budget(reqs, self._context, 0)
        self._slots = (reqs, slots)
        uniform = ks.count(ks[0]) == len(reqs)  # one C pass where all are equal (a gated round: all 0)
        self.policy.chosen[ks[0] if uniform else max(ks)] += 1
        return ks[0] if uniform else ks

    def _budget(self, reqs: list[Request], context: float, ahead: int) -> tuple:
        """(their estimate rows, budget_spans' (K_i, device ms)) at mean `context`, `ahead` tokens on."""
        p, n = self.policy, len(reqs)
        bucket, max_drafts = context_bucket(context), self.levers.max_drafts
        caps = lambda: request_caps([r.remaining - ahead for r in reqs], p.per_round, max_drafts)  # read if not gated
        slots = self.requests.slots(reqs, p.conditional)
        host, survival = (p.host.predict(n, False), p.host.predict(n, True)), self.requests.survival(slots)
        return slots, budget_spans(p.table, survival, caps, bucket, host, self._costs(n, bucket))

    def _budget_ahead(self, reqs: list[Request], draining: bool, tokens: int) -> None:
        """policy=budget, once a round is launched: the next round (these requests, up to `tokens` committed
        each) is chosen now, on estimates one round late; a uniform answer is kept (its round may launch
        ahead), a ragged one is chosen again in turn."""
        context = mean_context(reqs) + 1
        ks, device = self._budget(reqs, context, tokens)[1]
        if ks.count(ks[0]) == len(ks):
            self.ahead = Ahead(list(reqs), draining, Decision(ks[0]), True, context, device)

    def launched(self, reqs: list[Request], draining: bool, limits: Sequence[int] | None) -> None:
        """limits: the verify's draft limits; None for a gated round the policy chose, whose next batch is
        this one less those it finishes. After a verify the next round is planned only where no request's
        budget can cap its K."""
        self.flush()
        if limits is None:
            if (nxt := [r for r in reqs if r.remaining > 1]) and self.per_request:
                self._budget_ahead(nxt, draining, 1)
            elif nxt:
                self._plan(nxt, draining, max(r.remaining for r in nxt) - 2, exact=True)
            return
        left = [r.remaining - 1 - limit for r, limit in zip(reqs, limits, strict=True)]  # the least, each
        if self.per_request:  # every K_i's cap known now: none can bind
            if min(left) - 1 >= round_drafts(self.policy.per_round, self.levers.max_drafts):
                self._budget_ahead(reqs, draining, max(limits) + 1)
            return
        if max(left) - 1 >= round_drafts(self.policy.per_round, self.levers.max_drafts):  # the largest K
            self._plan(reqs, draining, max(left) - 1, exact=False)

    def _plan(self, reqs: list[Request], draining: bool, useful: int, exact: bool) -> None:
        """The next round's decision, on each request's tokens left and context after one committed token."""
        remaining = [r.remaining - 1 for r in reqs] if draining else None
        context = mean_context(reqs) + 1
        decision = self.policy.plan(len(reqs), self.levers.max_drafts, remaining, useful, context)
        self.ahead = Ahead(list(reqs), draining, decision, exact, context)

    def settled(
        self, k: int | None, reqs: Sequence[Request], limits: Sequence[int] = (), accepted: Sequence[int] = ()
    ) -> None:
        """k None: a plain decode step; 0: a gated round; else per request its draft limit and accepted
        drafts, observed at the next launch or decision (per request: now, its own estimate and the pool)."""
        self._k = k
        if self.per_request and k is not None:  # 0 (no limits): nothing tried, each estimate relaxes toward the pool
            p, (chosen, slots) = self.policy, self._slots
            slots = slots if chosen is reqs else self.requests.slots(reqs, p.conditional)
            p.observe_counts(*self.requests.observe(slots, limits, accepted, p.conditional))
        if k and not self.per_request:
            self._unobserved = (limits, accepted)
        elif k == 0:
            self.flush()
            self.policy.gated()
            self._context = mean_context(reqs)

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
