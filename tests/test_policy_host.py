"""The adaptive policy's host term: each round's measured wall minus the table's device time, learnt
online, so a table of graph replays alone does not speculate where host work makes it a loss."""

from __future__ import annotations

import pytest

from engine.policy.host import WINDOW, HostTerm
from engine.policy.span import Decision, SpanPolicy, round_times
from tests.policy_tables import table

PER_ROUND = 15
SPANS = (1, 2, 3, 5, 9, 16)


def test_first_walls_are_skipped_then_capped_then_the_median_and_unseen_buckets_count_zero():
    h = HostTerm(window=5)
    h.add(16, 4, 900.0, 2.0)  # the first round of (K=4, batch 16) pays one-off costs: not taken
    assert h.predict(16, True) == 0.0
    h.add(16, 4, 500.0, 2.0)  # the term starts from the least of three walls, each capped at the device time
    assert h.predict(16, True) == 2.0
    h.add(16, 4, 2.5, 2.0)
    assert h.predict(16, True) == 0.5  # the slow wall is outvoted at once
    h.add(16, 4, 3.0, 2.0)
    assert h.predict(16, True) == 0.5  # the start: min(2.0, 0.5, 1.0)
    h.add(16, 4, 300.0, 2.0)  # a pause: the median of (2.0, 0.5, 1.0, 298.0), the lower of its middle two
    assert h.predict(16, True) == 1.0
    h.add(9, 2, 9.0, 2.0)  # first of (K=2, batch 9)
    h.add(9, 2, 0.0, 2.0)  # another K and batch, the same kind and bucket; a wall under the table's time
    assert h.predict(16, True) == 1.0  # (2.0, 0.5, 1.0, 298.0, 0.0)
    h.add(16, 4, 2.2, 2.0)  # the window of five drops the first wall: (0.5, 1.0, 298.0, 0.0, 0.2)
    assert h.predict(16, True) == 0.5
    assert h.predict(64, True) == h.predict(3, True) == 0.0  # unseen buckets count 0: tried, then learnt
    assert h.predict(16, False) == 0.0  # gated rounds: nothing seen yet
    h.relax(16, 0.5)  # no gated term to relax toward
    assert h.predict(16, True) == 0.5
    for _ in range(3):
        h.add(16, 0, 0.6, 0.5)
    h.relax(16, 0.5)
    assert h.predict(16, False) == pytest.approx(0.1) and h.predict(16, True) == pytest.approx(0.3)
    h.add(16, 4, 2.0, 2.0)  # the walls moved with the term: (0.3, 149.05, 0.0, 0.15, 0.0)
    assert h.predict(16, True) == pytest.approx(0.15)


def test_a_burst_of_slow_walls_leaves_a_learnt_term_in_its_spread_a_lasting_change_is_learnt():
    # The H200 study at df8eaef: the gated term at 128 stood at ~0.4 ms over 58 walls; the next round's
    # three gated walls ran up to 13.8 ms over the table (their median 3.7). The EMA took the term to
    # 2.1 ms, and `code` c=128 then verified 4-8 drafts in every round, 20 % under plain.
    h = HostTerm()
    h.add(128, 0, 4.3, 3.9)
    for wall in (4.1, 4.4, 4.2, 4.3, 4.3, 4.4, 4.2, 4.3, 4.3, 4.4):
        h.add(128, 0, wall, 3.9)
    assert h.predict(128, False) == pytest.approx(0.4)
    for residual in (1.0, 3.7, 13.8):
        h.add(128, 0, 3.9 + residual, 3.9)
    assert h.predict(128, False) <= 0.5 + 1e-9  # within the steady walls' spread
    learnt = []
    for _ in range(WINDOW):  # host work grown for good: learnt once it is a majority of the window
        h.add(128, 0, 3.9 + 5.0, 3.9)
        learnt.append(h.predict(128, False) == pytest.approx(5.0))
    assert learnt.index(True) <= WINDOW // 2 - 1  # the slow walls before count toward it


def test_an_unseen_speculative_term_counts_the_gated_term_of_its_bucket():
    # The H200 study at f4464a4: at batch 256 (a new bucket) the gated term was learnt first and the
    # speculative one, unseen, counted 0, so 1-2 drafts looked level with the gated round on a ~4 ms
    # gated term and `code` c=256 verified them for three rounds (-7 % to the gate arm).
    h = HostTerm()
    for _ in range(4):
        h.add(256, 0, 9.1, 5.1)
    assert h.predict(256, False) == pytest.approx(4.0)
    assert h.predict(256, True) == pytest.approx(4.0)  # a superset of the gated round's host work
    assert h.predict(128, True) == 0.0  # nothing seen at 128: tried, then learnt
    for _ in range(3):
        h.add(256, 2, 22.0, 21.4)
    assert h.predict(256, True) == pytest.approx(0.6) and h.predict(256, False) == pytest.approx(0.6)


def test_a_new_buckets_term_starts_from_its_least_first_wall():
    h = HostTerm()
    for wall in (9.1, 9.1, 6.9, 9.0):  # the first skipped; then two slow starts and one settled round
        h.add(256, 0, wall, 5.1)
    assert h.predict(256, False) == pytest.approx(1.8)


def test_a_host_bound_round_is_learnt_in_a_few_rounds():
    h = HostTerm()
    for _ in range(12):
        h.add(64, 15, 30.0, 0.5)  # 29.5 ms of host work against 0.5 ms on the device
    assert h.predict(64, True) > 10.0  # from the device time's 0.5 ms, 1.5x a round


def test_a_gated_term_never_exceeds_the_speculative_one_at_its_bucket():
    h = HostTerm()
    for wall in (9.0, 9.0, 9.0):  # gated rounds at 128 with 3.3 ms of one-off host work
        h.add(128, 0, wall, 5.7)
    assert h.predict(128, False) == pytest.approx(3.3)  # no speculative term yet: the gated one stands
    for wall in (20.0, 20.0):
        h.add(128, 4, wall, 18.5)
    assert h.predict(128, True) == h.predict(128, False) == pytest.approx(1.5)
    assert h.ms[False, 128] == pytest.approx(3.3)  # kept: it falls back if the speculative term grows


def test_host_time_the_table_misses_turns_speculation_off():
    # On the device alone K=4 wins at batch 64 (~89 vs 62 tokens/ms); each speculative round's wall
    # carries 3 ms of host work the graph replays never show, a gated round's 0.1 ms.
    t = table(lambda b, s: 1.0 + 0.0005 * b * s, lambda b: 0.5, SPANS, batches=(1, 8, 64))
    policy = SpanPolicy(t, PER_ROUND, prior=[0.6] * PER_ROUND)
    ks = []
    for _ in range(12):
        k = policy.decide(64)
        ks.append(k)
        policy.observe_wall(64, k, round_times(t, 64, [k])[k] + (3.0 if k else 0.1))
    assert ks[0] > 0 and ks[-4:] == [0] * 4


def test_the_policy_stays_on_where_the_host_term_is_small():
    t = table(lambda b, s: 1.0 + 0.0005 * b * s, lambda b: 0.5, SPANS, batches=(1, 8, 64))
    policy = SpanPolicy(t, PER_ROUND, prior=[0.6] * PER_ROUND)
    for _ in range(12):
        k = policy.decide(64)
        policy.observe_wall(64, k, round_times(t, 64, [k])[k] + (0.2 if k else 0.1))
    assert policy.k > 0


def test_a_table_given_as_the_whole_cost_learns_no_host_term():
    t = table(lambda b, s: 1.0 + 0.0005 * b * s, lambda b: 0.5, SPANS, batches=(1, 8, 64))
    policy = SpanPolicy(t, PER_ROUND, prior=[0.6] * PER_ROUND, learn_host=False)
    for _ in range(12):
        k = policy.decide(64)
        policy.observe_wall(64, k, round_times(t, 64, [k])[k] + (3.0 if k else 0.1))
    assert policy.k > 0 and not policy.host.ms


def test_a_waves_last_round_teaches_no_host_term_a_capped_batchs_does():
    # The H200 study at 54c876b: every request of a lockstep wave finishes in its last round (one token
    # left, K forced to 0), and their completion made the gated term at batch 64 1.8 ms against ~0.3.
    t = table(lambda b, s: 1.0 + 0.0005 * b * s, lambda b: 0.5, SPANS, batches=(1, 8, 64))
    policy = SpanPolicy(t, PER_ROUND, prior=[0.6] * PER_ROUND)
    for _ in range(4):
        assert policy.decide(64, useful=0) == 0
        policy.observe_wall(64, 0, 30.0)
    assert not policy.host.ms
    for _ in range(4):
        assert policy.apply(Decision(0)) == 0  # a steady forced gated round (state kept) teaches
        policy.observe_wall(64, 0, round_times(t, 64, [0])[0] + 0.25)
    assert policy.host.predict(64, False) == pytest.approx(0.25)


def test_a_benchs_log_gets_every_wall_the_term_takes_before_its_clip():
    h = HostTerm()
    h.log = []
    h.add(64, 15, 9.0, 1.0)  # a new shape's first round: not taken, not logged
    for wall in (1.7, 1.8, 1.6, 7.0):
        h.add(64, 15, wall, 1.0)
    h.add(64, 0, 1.4, 1.0)
    h.add(64, 0, 0.5, 1.0)  # the first gated round skipped; under the table's time: a residual of 0
    assert [w[:2] for w in h.log] == [(True, 64)] * 4 + [(False, 64)]
    assert [w[2] for w in h.log] == pytest.approx([0.7, 0.8, 0.6, 6.0, 0.0])
    assert h.predict(64, True) < 6.0  # the term clipped the slow wall; the log did not


def test_the_sweep_summarises_the_residuals_per_kind_and_bucket():
    from engine.bench.policy_state import residual_summary

    walls = [(True, 64, v) for v in (0.5, 0.6, 0.7, 0.8, 4.0)] + [(False, 64, 0.3)]
    assert residual_summary(walls) == "gated@64:1:0.300:0.300:0.300 spec@64:5:0.700:2.720:4.000"
    assert residual_summary([]) == ""
