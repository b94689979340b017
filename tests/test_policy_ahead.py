"""The adaptive policy's host work while the device runs a round (engine/policy/choice.py AdaptiveSpans):
outcomes reach the policy at the next launch or before any decision in turn, a plan is made after a
verify only where the round's outcome cannot change its batch or its cap, and taken only for the
requests and levers it was made for. The engine-level behaviour is in tests/test_policy_engine.py."""

from __future__ import annotations

from types import SimpleNamespace

from engine.levers import Levers
from engine.policy.choice import AdaptiveSpans
from engine.policy.span import Decision

LEVERS = Levers()


class Policy:
    per_round = 8

    def __init__(self):
        self.calls: list[tuple] = []

    def observe(self, limits, accepted):
        self.calls.append(("observe", list(limits), list(accepted)))

    def plan(self, batch, max_drafts, remaining, useful, context):
        self.calls.append(("plan", batch, remaining, useful))
        return Decision(4)

    def apply(self, decision):
        self.calls.append(("apply", decision.k))
        return decision.k

    def decide(self, batch, max_drafts, remaining, useful, context):
        self.calls.append(("decide", batch))
        return 2

    def gated(self):
        self.calls.append(("gated",))


def reqs(*remaining):
    return [SimpleNamespace(remaining=r, num_kv=64) for r in remaining]


def spans() -> tuple[AdaptiveSpans, Policy]:
    policy = Policy()
    chooser = AdaptiveSpans(policy)
    chooser.configure(LEVERS)
    return chooser, policy


def test_an_outcome_is_observed_at_the_next_launch_once():
    ahead, policy = spans()
    batch = reqs(40, 50)
    ahead.settled(8, batch, [8, 8], [3, 8])
    assert policy.calls == []
    ahead.launched(batch, False, [8, 8])
    ahead.launched(batch, False, [8, 8])
    assert [c for c in policy.calls if c[0] == "observe"] == [("observe", [8, 8], [3, 8])]


def test_a_plan_after_a_verify_reads_the_fewest_tokens_left_and_is_taken_for_its_requests():
    ahead, policy = spans()
    batch = reqs(40, 50)
    ahead.launched(batch, True, [8, 8])
    # the most left (one token committed) for the wave; the fewest for the cap: 50 - 1 - 8 - 1
    assert policy.calls == [("plan", 2, [39, 49], 40)]
    assert ahead.next_k(batch, True) == 4 and ahead.next_k(batch, False) == 0  # known now: the round launched ahead
    assert ahead.choose(batch, True) == 4 and policy.calls[-1] == ("apply", 4)
    assert ahead.ahead is None and ahead.next_k(batch, True) == 0


def test_no_plan_where_the_round_may_cap_the_next():
    ahead, policy = spans()
    ahead.launched(reqs(10, 3), False, [2, 2])  # 10 - 1 - 2 - 1 = 6 drafts < 8
    assert ahead.ahead is None and not [c for c in policy.calls if c[0] == "plan"]
    ahead.configure(Levers(max_drafts=4))  # MAX_DRAFTS caps K at 4: 6 drafts cover it
    ahead.launched(reqs(10, 3), False, [2, 2])
    assert ahead.ahead is not None and policy.calls[-1] == ("plan", 2, None, 6)


def test_a_verify_plan_holds_for_the_batch_its_requests_leave_in_the_same_bucket():
    batch = reqs(40, 50, 9, 60, 70, 80)
    for survivors, taken in ((batch[:5], True), (batch[1:], True), (batch[:4], False), (batch + reqs(5, 6), True)):
        ahead, _ = spans()
        ahead.launched(batch, False, [8] * 6)  # batch 6: the host term's bucket 5-8
        assert (ahead.choose(survivors, False) == 4) is taken


def test_a_plan_for_other_requests_or_levers_is_dropped_and_the_outcome_observed_first():
    batch = reqs(40, 50)
    for other_reqs, draining, levers in (
        (batch[:1], False, LEVERS),
        (batch, True, LEVERS),
        (batch, False, Levers(max_batch=3)),
    ):
        ahead, policy = spans()
        ahead.launched(batch, False, [8, 8])
        ahead.settled(8, batch, [8, 8], [1, 2])
        ahead.configure(levers)  # new levers (the engine's set_levers) drop the plan
        assert ahead.choose(other_reqs, draining) == 2  # decided in turn ...
        assert policy.calls[-2:] == [("observe", [8, 8], [1, 2]), ("decide", len(other_reqs))]  # ... outcome in


def test_a_gated_round_plans_for_the_requests_it_does_not_finish_and_gates_its_successor():
    ahead, policy = spans()
    batch = reqs(1, 5, 9)
    ahead.launched(batch, True, None)
    assert policy.calls == [("plan", 2, [4, 8], 7)] and ahead.ahead.reqs == batch[1:]
    assert not ahead.gates_next(batch[1:])  # the plan is K = 4, not a gated round
    ahead.ahead = ahead.ahead.__class__(batch[1:], True, Decision(0))
    assert ahead.gates_next(batch[1:]) and not ahead.gates_next(batch)
    ahead.settled(0, batch[1:])
    assert policy.calls[-1] == ("gated",)
