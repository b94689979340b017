"""The adaptive policy's host work while the device runs a round (engine/policy_ahead.py): outcomes
reach the policy at the next launch or before any decision in turn, a plan is made after a verify
only where the round's outcome cannot change its batch or its cap, and taken only for the requests
and levers it was made for. The engine-level behaviour is in tests/test_policy_engine.py."""

from __future__ import annotations

from types import SimpleNamespace

from engine.levers import Levers
from engine.policy.ahead import PolicyAhead, ahead_key
from engine.policy.span import Decision

LEVERS = Levers()


class Policy:
    per_round = 8

    def __init__(self):
        self.calls: list[tuple] = []

    def observe(self, limits, accepted):
        self.calls.append(("observe", list(limits), list(accepted)))

    def plan(self, batch, max_drafts, remaining, useful):
        self.calls.append(("plan", batch, remaining, useful))
        return Decision(4)

    def apply(self, decision):
        self.calls.append(("apply", decision.k))
        return decision.k


def reqs(*remaining):
    return [SimpleNamespace(remaining=r) for r in remaining]


def test_an_outcome_is_observed_at_the_next_launch_once():
    ahead, policy, batch = PolicyAhead(), Policy(), reqs(40, 50)
    ahead.observed([8, 8], [3, 8])
    assert policy.calls == []
    ahead.after_verify(policy, batch, [8, 8], LEVERS, False)
    ahead.after_verify(policy, batch, [8, 8], LEVERS, False)
    assert [c for c in policy.calls if c[0] == "observe"] == [("observe", [8, 8], [3, 8])]


def test_a_plan_after_a_verify_reads_the_fewest_tokens_left_and_is_taken_for_its_requests():
    ahead, policy, batch = PolicyAhead(), Policy(), reqs(40, 50)
    ahead.after_verify(policy, batch, [8, 8], LEVERS, True)
    # the most left (one token committed) for the wave; the fewest for the cap: 50 - 1 - 8 - 1
    assert policy.calls == [("plan", 2, [39, 49], 40)]
    assert ahead.take(policy, batch, ahead_key(LEVERS, True)) == 4 and policy.calls[-1] == ("apply", 4)
    assert ahead.ahead is None


def test_no_plan_where_the_round_may_cap_the_next():
    policy, ahead = Policy(), PolicyAhead()
    ahead.after_verify(policy, reqs(10, 3), [2, 2], LEVERS, False)  # 10 - 1 - 2 - 1 = 6 drafts < 8
    assert ahead.ahead is None and not [c for c in policy.calls if c[0] == "plan"]
    trimmed = Levers(max_drafts=4)  # MAX_DRAFTS caps K at 4: 6 drafts cover it
    ahead.after_verify(policy, reqs(10, 3), [2, 2], trimmed, False)
    assert ahead.ahead is not None and policy.calls[-1] == ("plan", 2, None, 6)


def test_a_verify_plan_holds_for_the_batch_its_requests_leave_in_the_same_bucket():
    policy, batch = Policy(), reqs(40, 50, 9, 60, 70, 80)
    for survivors, taken in ((batch[:5], True), (batch[1:], True), (batch[:4], False), (batch + reqs(5, 6), True)):
        ahead = PolicyAhead()
        ahead.after_verify(policy, batch, [8] * 6, LEVERS, False)  # batch 6: the host term's bucket 5-8
        assert (ahead.take(policy, survivors, ahead_key(LEVERS, False)) == 4) is taken


def test_a_plan_for_other_requests_or_levers_is_dropped_and_the_outcome_observed_first():
    policy, batch = Policy(), reqs(40, 50)
    for other_reqs, key in ((batch[:1], ahead_key(LEVERS, False)), (batch, ahead_key(LEVERS, True))):
        ahead = PolicyAhead()
        ahead.after_verify(policy, batch, [8, 8], LEVERS, False)
        ahead.observed([8, 8], [1, 2])
        assert ahead.take(policy, other_reqs, key) is None  # decide in turn ...
        assert policy.calls[-1] == ("observe", [8, 8], [1, 2])  # ... with every outcome in


def test_a_gated_round_plans_for_the_requests_it_does_not_finish():
    ahead, policy, batch = PolicyAhead(), Policy(), reqs(1, 5, 9)
    ahead.after_gated(policy, batch, LEVERS, True)
    assert policy.calls == [("plan", 2, [4, 8], 7)] and ahead.ahead.reqs == batch[1:]
