"""AutoHedge with a fake clock, the per-round chain selection, and the hedge levers' resolution
(no weights)."""

from __future__ import annotations

import pytest

from engine.hedge import AutoHedge, Candidate, effective_positions, plan_chains


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def drive(ctl: AutoHedge, clock: Clock, rate_of, rounds: int, tokens: int = 8, ran=None) -> list[int]:
    """Run rounds: each takes tokens / rate(C) seconds at the C the controller asks for (or `ran`)."""
    asked = []
    for _ in range(rounds):
        c = ctl.chains()
        asked.append(c)
        executed = c if ran is None else ran(c)
        clock.now += tokens / rate_of(executed)
        ctl.tick(executed, tokens)
    return asked


def small(clock: Clock, max_chains: int = 3, **kw) -> AutoHedge:
    args = dict(window=4, rewindow=2, keep=12, cycles=2, margin=1.03, hold=50, gap_s=0.5) | kw
    return AutoHedge(max_chains, clock=clock, **args)


def test_explores_every_c_then_commits_to_the_best():
    clock = Clock()
    ctl = small(clock)
    rates = {0: 100.0, 1: 130.0, 2: 160.0, 3: 150.0}
    asked = drive(ctl, clock, rates.get, 1 + 2 * 4 * 4)  # one anchoring round, then 2 cycles of 4 windows of 4
    assert set(asked) == {0, 1, 2, 3} and ctl.committed == 2
    assert [c for c in asked[1:17:4]] == [0, 1, 2, 3]  # one window per C, in rotation
    assert ctl.medians()[2] == pytest.approx(160.0)
    assert drive(ctl, clock, rates.get, 10) == [2] * 10


def test_a_larger_c_must_win_by_the_margin():
    clock = Clock()
    ctl = small(clock)
    drive(ctl, clock, {0: 100.0, 1: 102.0, 2: 101.0, 3: 99.0}.get, 1 + 32)
    assert ctl.committed == 0  # +2% is inside the 3% margin: fewer chains


def test_flat_landscape_settles_at_zero():
    clock = Clock()
    ctl = small(clock)
    drive(ctl, clock, lambda c: 100.0, 1 + 32)
    assert ctl.committed == 0


def test_re_explores_after_the_hold_and_follows_the_new_landscape():
    clock = Clock()
    ctl = small(clock, hold=20)
    drive(ctl, clock, {0: 100.0, 1: 200.0, 2: 120.0, 3: 110.0}.get, 1 + 32)
    assert ctl.committed == 1
    drive(ctl, clock, {0: 100.0, 1: 200.0, 2: 120.0, 3: 110.0}.get, 19)
    assert ctl.committed == 1
    drive(ctl, clock, lambda c: 100.0, 1)  # the 20th held round ends the hold
    assert ctl.committed is None and ctl.chains() == 0
    # Re-exploration uses the shorter window (2 rounds) on fresh samples only.
    asked = drive(ctl, clock, {0: 300.0, 1: 100.0, 2: 100.0, 3: 100.0}.get, 2 * 4 * 2)
    assert asked[:4] == [0, 0, 1, 1] and ctl.committed == 0


def test_break_window_never_charges_the_gated_interval():
    clock = Clock()
    ctl = small(clock, window=4)
    drive(ctl, clock, lambda c: 100.0, 3)  # anchor + two rounds into C=0's window
    ctl.break_window()  # a gated round: no tick
    clock.now += 0.3  # the gated rounds take time (under the idle threshold)
    ctl.tick(0, 8)  # the first resumed round only re-anchors
    assert ctl.rates[0] == deque_of()
    drive(ctl, clock, lambda c: 100.0, 4)
    assert list(ctl.rates[0]) == [pytest.approx(100.0)]  # 4 clean rounds at 100 tok/s, nothing else
    assert ctl.chains() == 1


def deque_of():
    from collections import deque

    return deque(maxlen=12)


def test_a_window_is_booked_to_the_c_that_ran():
    clock = Clock()
    ctl = small(clock, max_chains=2)
    rates = {0: 100.0, 1: 150.0, 2: 300.0}
    # The controller asks for C=2 but the round can only run 1 chain (e.g. short budgets): the
    # window is booked to C=1, never to C=2.
    drive(ctl, clock, rates.get, 1 + 3 * 4, ran=lambda c: min(c, 1))
    assert list(ctl.rates[2]) == [] and len(ctl.rates[1]) == 2
    assert all(r == pytest.approx(150.0) for r in ctl.rates[1])


def test_a_window_whose_rounds_ran_different_c_restarts():
    clock = Clock()
    ctl = small(clock, window=4)
    ran = iter([0, 0, 1, 0, 0, 0, 0])
    drive(ctl, clock, {0: 100.0, 1: 1000.0}.get, 1)  # anchor
    drive(ctl, clock, {0: 100.0, 1: 1000.0}.get, 7, ran=lambda c: next(ran))
    assert list(ctl.rates[0]) == [pytest.approx(100.0)] and list(ctl.rates[1]) == []


def test_long_idle_gaps_break_the_window():
    clock = Clock()
    ctl = small(clock, window=4, gap_s=0.5)
    drive(ctl, clock, lambda c: 100.0, 3)
    clock.now += 10.0  # the engine sat idle
    ctl.tick(0, 8)
    assert list(ctl.rates[0]) == []
    drive(ctl, clock, lambda c: 100.0, 4)
    assert list(ctl.rates[0]) == [pytest.approx(100.0)]


def test_a_prefill_between_rounds_is_not_charged_but_keeps_the_window():
    clock = Clock()
    ctl = small(clock, window=4)
    drive(ctl, clock, lambda c: 100.0, 3)  # anchor + two rounds into C=0's window
    ctl.reanchor()
    clock.now += 0.4  # a prefill step
    ctl.tick(0, 8)  # re-anchors only
    drive(ctl, clock, lambda c: 100.0, 2)  # completes the 4-round window: 2 + 2 rounds, all at 100 tok/s
    assert list(ctl.rates[0]) == [pytest.approx(100.0)]


def test_no_chains_to_explore_stays_at_zero():
    clock = Clock()
    ctl = small(clock, max_chains=0)
    drive(ctl, clock, lambda c: 100.0, 1 + 8)
    assert ctl.committed == 0 and ctl.chains() == 0


# ---- selection ----


def test_plan_chains_fcfs_greedy_limits_cap_knee_and_slots():
    cands = [Candidate(True, 7), Candidate(False, 7), Candidate(True, 1), Candidate(True, 0), Candidate(True, 7)]
    positions = [0, 1, 2]
    assert plan_chains(cands, positions, 8, cap=8, knee=0, slots=99) == [
        (0, 0),
        (0, 1),
        (0, 2),
        (2, 0),
        (4, 0),
        (4, 1),
        (4, 2),
    ]
    assert plan_chains(cands, positions, 8, cap=2, knee=0, slots=99) == [(0, 0), (0, 1), (0, 2), (2, 0)]
    assert plan_chains(cands, positions, 8, cap=8, knee=0, slots=4) == [(0, 0), (0, 1), (0, 2), (2, 0)]
    # knee: (5 main + chains) x 8 rows <= 64 -> 3 chains at most
    assert plan_chains(cands, positions, 8, cap=8, knee=64, slots=99) == [(0, 0), (0, 1), (0, 2)]
    assert plan_chains(cands, positions, 8, cap=8, knee=40, slots=99) == []
    assert plan_chains(cands, [], 8, cap=8, knee=0, slots=99) == []
    assert plan_chains(cands, positions, 1, cap=8, knee=0, slots=99) == []  # gated / one-token span


def test_effective_positions():
    assert effective_positions((2, 0, 2, 9), 7) == (0, 2)
    assert effective_positions((), 7) == (0,)
    assert effective_positions((7,), 7) == ()
