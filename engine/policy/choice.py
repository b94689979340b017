"""The span choice a speculative round calls (engine/round.py): the static levers or the adaptive policy,
behind the same calls in round order: `choose` (this round's K; 0 = a gated round, which keeps the capture),
`launched` (its forwards are on the device), `settled` (its outcome; None: a plain decode step), `wall`
(the step's ms); `gates_next` tells a one-token round whether its successor may launch ahead (gated too)."""

from __future__ import annotations

from collections.abc import Sequence

from engine.levers import Levers
from engine.policy.ahead import PolicyAhead, ahead_key
from engine.policy.costs import CostTable
from engine.policy.span import SpanPolicy
from engine.request import Request


def round_drafts(drafts_per_round: int, max_drafts: int) -> int:
    """k: drafts entering a speculative round's verify, uniform across the batch (span = 1 + k);
    max_drafts 0 = no trim."""
    return min(drafts_per_round, max_drafts) if max_drafts else drafts_per_round


class StaticSpans:
    """K = the drafter's drafts per round, trimmed by MAX_DRAFTS."""

    policy: SpanPolicy | None = None

    def __init__(self, per_round: int):
        self.per_round = per_round

    def choose(self, reqs: list[Request], levers: Levers, draining: bool) -> int:
        return round_drafts(self.per_round, levers.max_drafts)

    def launched(self, reqs: list[Request], levers: Levers, draining: bool, limits: Sequence[int] | None) -> None:
        pass

    def settled(self, k: int | None, limits: Sequence[int] = (), accepted: Sequence[int] = ()) -> None:
        pass

    def wall(self, batch: int, ms: float | None) -> None:
        pass

    def gates_next(self, reqs: list[Request]) -> bool:
        return True


class AdaptiveSpans:
    """K per round from the cost table and the online acceptance estimate (engine/policy/span.py), with
    the policy's host work done while the device runs the round before (engine/policy/ahead.py)."""

    def __init__(self, table: CostTable, per_round: int, learn_host: bool = True):
        self.policy = SpanPolicy(table, per_round, learn_host=learn_host)
        self.ahead = PolicyAhead()
        self._k: int | None = None  # the K of the last round, until its wall arrives

    def set_table(self, table: CostTable) -> None:
        """A table measured on this device: the host term is learnt, the acceptance estimate kept."""
        self.ahead.drop()
        self.ahead.flush(self.policy)
        conditional = self.policy.conditional
        self.policy = SpanPolicy(table, self.policy.per_round)
        self.policy.conditional = list(conditional)

    def choose(self, reqs: list[Request], levers: Levers, draining: bool) -> int:
        k = self.ahead.take(self.policy, reqs, ahead_key(levers, draining))
        if k is None:
            remaining = [r.remaining for r in reqs]  # one pass over the requests: each costs at batch 256
            k = self.policy.decide(len(reqs), levers.max_drafts, remaining if draining else None, max(remaining) - 1)
        return k

    def launched(self, reqs: list[Request], levers: Levers, draining: bool, limits: Sequence[int] | None) -> None:
        """limits: the verify's draft limits; None for a gated round the policy chose."""
        if limits is None:
            self.ahead.after_gated(self.policy, reqs, levers, draining)
        else:
            self.ahead.after_verify(self.policy, reqs, limits, levers, draining)

    def settled(self, k: int | None, limits: Sequence[int] = (), accepted: Sequence[int] = ()) -> None:
        """k None: a plain decode step (nothing to learn); 0: a gated round (nothing observed); else per
        request its draft limit and accepted drafts."""
        if k:
            self.ahead.observed(limits, accepted)
        elif k == 0:
            self.ahead.flush(self.policy)
            self.policy.gated()
        self._k = k

    def wall(self, batch: int, ms: float | None) -> None:
        """The engine's wall of the step that ran the last round (None: it captured a graph, or it
        was no round of this policy's)."""
        k, self._k = self._k, None
        if k is not None and ms is not None:
            self.policy.observe_wall(batch, k, ms)

    def gates_next(self, reqs: list[Request]) -> bool:
        return self.ahead.gates(reqs)
