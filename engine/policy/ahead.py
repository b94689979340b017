"""The adaptive policy's host work off a round's critical path (engine/round.py): once a round is launched,
feed the policy the round before's outcome and plan the next round's K (on an estimate one round late). A
gated round's plan holds for exactly its requests (each commits one token), a speculative round's for any
batch of the same power-of-two bucket (the host term's); both only under the same levers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.levers import Levers
from engine.policy.span import Decision, SpanPolicy
from engine.request import Request


@dataclass(frozen=True)
class Ahead:
    """A decision for the next round, made while the device ran this one, under these (max_drafts,
    max_batch, draining): for exactly these requests, or (not exact) any batch of their bucket."""

    reqs: list[Request]
    key: tuple[int, int, bool]
    decision: Decision
    exact: bool = True

    def holds_for(self, reqs: list[Request], key: tuple[int, int, bool]) -> bool:
        if key != self.key:
            return False
        if self.exact:
            return reqs == self.reqs
        return (len(reqs) - 1).bit_length() == (len(self.reqs) - 1).bit_length()  # HostTerm's buckets


def ahead_key(levers: Levers, draining: bool) -> tuple[int, int, bool]:
    return levers.max_drafts, levers.max_batch, draining


class PolicyAhead:
    def __init__(self) -> None:
        self.ahead: Ahead | None = None
        self._unobserved: tuple[Sequence[int], Sequence[int]] | None = None

    def drop(self) -> None:
        """Levers or the cost table changed: a plan made ahead no longer holds."""
        self.ahead = None

    def take(self, policy: SpanPolicy, reqs: list[Request], key: tuple[int, int, bool]) -> int | None:
        """This round's K from the plan made for it, or None: decide in turn (every outcome observed)."""
        ahead, self.ahead = self.ahead, None
        if ahead is not None and ahead.holds_for(reqs, key):
            return policy.apply(ahead.decision)
        self.flush(policy)
        return None

    def gates(self, reqs: list[Request]) -> bool:
        """Whether the plan made for the next round is a gated round of exactly these requests."""
        a = self.ahead
        return a is not None and a.exact and a.decision.k == 0 and a.reqs == reqs

    def observed(self, limits: Sequence[int], accepted: Sequence[int]) -> None:
        """A speculative round's outcome, fed to the policy at the next launch (or decision in turn)."""
        self._unobserved = (limits, accepted)

    def flush(self, policy: SpanPolicy | None) -> None:
        if self._unobserved is not None and policy is not None:
            policy.observe(*self._unobserved)
            self._unobserved = None

    def after_gated(self, policy: SpanPolicy, reqs: list[Request], levers: Levers, draining: bool) -> None:
        """A gated round is on the device: each request commits exactly one token, so the next batch is
        this one less those it finishes on their budget."""
        self.flush(policy)
        nxt = [r for r in reqs if r.remaining > 1]
        if nxt:
            remaining = [r.remaining - 1 for r in nxt]
            self._plan(policy, nxt, levers, draining, remaining, max(remaining) - 1)

    def after_verify(
        self, policy: SpanPolicy, reqs: list[Request], limits: Sequence[int], levers: Levers, draining: bool
    ) -> None:
        """A speculative round is on the device: each request commits 1 to 1 + limit tokens. Planned only
        where, whatever it accepts, no request's budget can cap the next round's K (a wave's values read
        each request's most tokens left, one round early)."""
        self.flush(policy)
        useful = max(r.remaining - 1 - limit for r, limit in zip(reqs, limits, strict=True)) - 1
        if useful >= min(levers.max_drafts or policy.per_round, policy.per_round):  # the largest K
            self._plan(policy, reqs, levers, draining, [r.remaining - 1 for r in reqs], useful, exact=False)

    def _plan(
        self,
        policy: SpanPolicy,
        reqs: list[Request],
        levers: Levers,
        draining: bool,
        remaining: list[int],
        useful: int,
        exact: bool = True,
    ) -> None:
        decision = policy.plan(len(reqs), levers.max_drafts, remaining if draining else None, useful)
        self.ahead = Ahead(list(reqs), ahead_key(levers, draining), decision, exact)
