"""The adaptive span policy's decision on synthetic cost tables and acceptance profiles."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from engine.levers import Levers, gated
from engine.policy.costs import expected_committed, read_cost_table
from engine.policy.span import (
    PROBE_FIRST,
    PROBE_FLOOR,
    PROBE_LOSS_LEAST,
    SPEC_DISCOUNT,
    SpanPolicy,
    best_span,
    round_times,
    span_candidates,
)
from tests.policy_tables import table

PER_ROUND = 15
SPANS = (1, 2, 3, 5, 9, 16)


def choose_span(t, batch: int, conditional, candidates) -> tuple[int, dict[int, float]]:
    """`best_span` on the table's round times."""
    return best_span(round_times(t, batch, candidates), batch, conditional)


def free_rows():
    """Verify rows cost nothing extra (memory-bound), the drafter is cheap."""
    return table(lambda b, s: 10.0, lambda b: 1.0, SPANS)


def costly_drafter():
    return table(lambda b, s: 10.0 + 0.01 * b * s, lambda b: 40.0, SPANS)


def test_candidates_are_the_variants_the_table_measured_up_to_the_cap():
    assert span_candidates(PER_ROUND, 0, free_rows()) == [0, 1, 2, 4, 8, 15]
    assert span_candidates(PER_ROUND, 3, free_rows()) == [0, 1, 2]  # span 4 (k = 3) was not profiled
    assert span_candidates(PER_ROUND, 4, free_rows()) == [0, 1, 2, 4]


def test_all_drafts_when_rows_are_free_and_acceptance_high():
    k, values = choose_span(free_rows(), 16, [0.9] * PER_ROUND, span_candidates(PER_ROUND, 0, free_rows()))
    assert k == PER_ROUND
    expected = 16 * expected_committed([0.9] * PER_ROUND, PER_ROUND) / 11.0
    assert values[PER_ROUND] == pytest.approx(expected / (1 + SPEC_DISCOUNT))
    assert values[0] == pytest.approx(16 / 10.0)


def test_near_break_even_the_gated_round_wins():
    # K = 2 expects 2.44 tokens in 2.36x a gated round's time: 3.4 % ahead, inside the discount.
    t = table(lambda b, s: 10.0 + 2.0 * (s - 1), lambda b: 9.6, SPANS)
    k, values = choose_span(t, 16, [0.8] * PER_ROUND, [0, 2])
    assert expected_committed([0.8] * PER_ROUND, 2) / 23.6 == pytest.approx(1.034 / 10.0, rel=1e-3)
    assert k == 0 and values[0] > values[2]


def test_zero_when_the_drafter_costs_more_than_it_saves():
    t = costly_drafter()
    for batch in (1, 8, 64):
        assert choose_span(t, batch, [0.6] * PER_ROUND, span_candidates(PER_ROUND, 0, t))[0] == 0


def test_low_acceptance_picks_a_short_span():
    # Every verify row costs: a long span only pays where its drafts are likely accepted.
    t = table(lambda b, s: 5.0 + 0.05 * b * s, lambda b: 2.0, SPANS)
    profile = [0.8, 0.5] + [0.05] * (PER_ROUND - 2)
    k, _ = choose_span(t, 32, profile, span_candidates(PER_ROUND, 0, t))
    assert 0 < k < 4


def test_max_drafts_caps_and_the_gate_is_the_levers_rule():
    policy = SpanPolicy(free_rows(), PER_ROUND)
    assert policy.decide(8, max_drafts=2) == 2
    # MAX_BATCH is the scheduler's (levers.gated): the policy never sees a gated batch's round
    assert gated(8, Levers(max_batch=8).max_batch) and not gated(7, 8) and not gated(10**6, Levers().max_batch)
    assert policy.decide(64) == PER_ROUND  # the cap lifted: all drafts, 5x the value, taken at once


def test_a_small_lead_waits_for_patience_a_large_one_is_taken_at_once():
    # K = 15 at batch 1 (rows nearly free); at batch 256 a 16-row verify costs 8x a gated round.
    t = table(lambda b, s: 8.0 + 0.06 * b * (s - 1), lambda b: 0.5 + 0.05 * b, SPANS, batches=(1, 64, 256))
    policy = SpanPolicy(t, PER_ROUND, prior=[0.85] * PER_ROUND)
    assert policy.decide(1) == PER_ROUND
    _, values = choose_span(t, 256, policy.conditional, span_candidates(PER_ROUND, 0, t))
    assert values[0] > values[PER_ROUND] * (1 + policy.jump)
    assert policy.decide(256) == 0  # no three rounds of K = 15 at batch 256
    slow = SpanPolicy(t, PER_ROUND, prior=[0.85] * PER_ROUND, jump=float("inf"))
    slow.decide(1)
    assert [slow.decide(256) for _ in range(slow.patience)] == [PER_ROUND] * (slow.patience - 1) + [0]


def test_batches_outside_the_table_take_its_nearest_end():
    t = table(lambda b, s: 5.0 + b * s, lambda b: float(b), SPANS)
    assert round_times(t, 500, [0, 4]) == round_times(t, 64, [0, 4]) == {0: 5.0 + 64, 4: 64.0 + 5.0 + 64 * 5}
    assert round_times(t, 0, [0, 4]) == round_times(t, 1, [0, 4])


def test_observe_keeps_conditional_acceptance_per_position():
    policy = SpanPolicy(free_rows(), 4, prior=[0.5] * 4, ema=1.0)
    # limits 4, 4, 1: accepted 0, 2, 1 -> position 0 tried 3 (hits 2), 1 tried 1 (hit 1), 2 tried 1 (miss)
    policy.observe([4, 4, 1], [0, 2, 1])
    assert policy.conditional == [2 / 3, 1.0, 0.0, 0.5]
    policy.gated()
    assert policy.conditional[2] == pytest.approx(0.01 * 0.5)


def _switches(policy: SpanPolicy, rounds: int, rate: float, seed: int) -> tuple[int, list[int]]:
    rng, ks, switches = random.Random(seed), [], 0
    for _ in range(rounds):
        k = policy.decide(16)
        switches += bool(ks) and k != ks[-1]
        ks.append(k)
        accepted = []
        for _ in range(16):
            n = 0
            while n < k and rng.random() < rate:
                n += 1
            accepted.append(n)
        policy.observe([k] * 16, accepted)
    return switches, ks


def test_stable_under_noisy_acceptance():
    # Verify rows cost enough that K = 4 and K = 8 sit close at this acceptance: noise alone would flip them.
    t = table(lambda b, s: 6.0 + 0.035 * b * s, lambda b: 1.5, SPANS)
    steady, ks = _switches(SpanPolicy(t, PER_ROUND, prior=[0.75] * PER_ROUND), 300, 0.75, seed=1)
    jumpy, _ = _switches(SpanPolicy(t, PER_ROUND, prior=[0.75] * PER_ROUND, margin=0.0, patience=1), 300, 0.75, seed=1)
    assert jumpy > 10  # the profile is noisy enough to flap without hysteresis
    assert steady <= jumpy // 5
    assert 0 not in ks


def test_a_drop_in_acceptance_moves_k_down_after_patience():
    t = table(lambda b, s: 5.0 + 0.02 * b * s, lambda b: 2.0, SPANS)
    policy = SpanPolicy(t, PER_ROUND)
    high = policy.decide(16)
    assert high > 0
    rounds = 0
    while policy.k == high and rounds < 30:
        policy.observe([high] * 16, [0] * 16)  # nothing accepted any more
        policy.decide(16)
        rounds += 1
    assert policy.k == 0
    assert rounds >= policy.patience


def test_a_table_without_span_1_or_drafter_rows_is_refused():
    with pytest.raises(ValueError, match="span 1"):
        SpanPolicy(table(lambda b, s: 1.0, lambda b: 1.0, (2, 3)), 2)
    with pytest.raises(ValueError, match=r"prior"):
        SpanPolicy(free_rows(), 2, prior=[1.5, 0.5])


H200_4B = Path(__file__).parent / "data" / "policy" / "h200-4b-profile.csv"  # the study's profile, 56bd84f


def test_cost_gated_rounds_do_not_drift_the_estimate_into_costly_probes():
    # The H200's 4B-geometry table: at batch 256 a 16-row round costs ~70 ms against ~8 ms gated.
    policy = SpanPolicy(read_cost_table(H200_4B), PER_ROUND)
    for _ in range(20):  # code-like acceptance seen at a small batch
        k = policy.decide(8)
        policy.observe([k] * 8, [13, 0, 5, 15, 2, 7, 1, 9])
    code_like = list(policy.conditional)
    ks = []
    for _ in range(300):  # a long stretch at batch 256: the batch's cost says 0
        ks.append(policy.decide(256))
        if ks[-1] == 0:
            policy.gated()
    assert set(ks[3:]) == {0} and policy.conditional == code_like
    assert policy.decide(8) > 0  # the batch drained: speculation comes back on the same estimate


def test_a_starved_estimate_relaxes_and_probes_again():
    policy = SpanPolicy(read_cost_table(H200_4B), PER_ROUND)
    for _ in range(1000):  # nothing accepted at all, until it says 0 even for one request
        k = policy.decide(1)
        if k == 0:
            break
        policy.observe([k], [0])
    assert k == 0
    rounds = 0
    while policy.decide(1) == 0 and rounds < 1000:
        policy.gated()
        rounds += 1
    assert 0 < rounds < 1000  # it probes again rather than latching at 0


def _profile(first: float, last: float) -> list[float]:
    return [first + (last - first) * i / (PER_ROUND - 1) for i in range(PER_ROUND)]


def _run(policy: SpanPolicy, rng: random.Random, batch: int, conditional: list[float], rounds: int) -> list[int]:
    """Rounds of `batch` requests whose drafts are accepted by `conditional`; the K of each."""
    ks = []
    for _ in range(rounds):
        k = policy.decide(batch)
        ks.append(k)
        if k == 0:
            policy.gated()
            continue
        accepted = []
        for _ in range(batch):
            n = 0
            while n < k and rng.random() < conditional[n]:
                n += 1
            accepted.append(n)
        policy.observe([k] * batch, accepted)
    return ks


def test_a_cost_gated_estimate_is_probed_and_follows_acceptance_back_up():
    # The H200 study at b0194de: a low-acceptance stretch left an estimate that gates batch 64, and with
    # nothing observed while gated, `code` c=64 stayed at 0 where 8 drafts win by a quarter.
    policy, rng = SpanPolicy(read_cost_table(H200_4B), PER_ROUND), random.Random(0)
    _run(policy, rng, 32, _profile(0.5, 0.4), 200)
    ks = _run(policy, rng, 64, _profile(0.87, 0.78), 300)
    times = policy._round_times(64, 0)
    first = ks.index(next(k for k in ks if k))
    least = PROBE_FIRST * times[ks[first]] * PROBE_LOSS_LEAST / (1.0 - PROBE_FLOOR)
    assert least <= first * times[0] < PROBE_FIRST * times[ks[first]]  # due by its value loss, before its ms
    assert 0 not in ks[150:] and policy.k == 8  # larger probes refresh the positions past K: 2, 4, then 8


def _probe_share(ks: list[int], times: dict[int, float], k_in_force: int) -> float:
    """The share of the time the rounds away from the K in force took beyond it."""
    return sum(times[k] - times[k_in_force] for k in ks if k != k_in_force) / sum(times[k] for k in ks)


def _probe_loss(ks: list[int], policy: SpanPolicy, batch: int) -> float:
    """The share of the rounds' value the rounds away from the gated round gave up, on the estimate."""
    times = policy._round_times(batch, 0)
    _, values = best_span(times, batch, policy.conditional)
    return sum(times[k] * max(1.0 - values[k] / values[0], 0.0) for k in ks if k) / sum(times[k] for k in ks)


def test_probes_are_spaced_by_their_value_loss_and_back_off_where_acceptance_stays_low():
    policy, rng = SpanPolicy(read_cost_table(H200_4B), PER_ROUND), random.Random(0)
    low = _profile(0.5, 0.4)
    _run(policy, rng, 32, low, 200)
    before = sum(n for (batch, _), n in policy.probed.items() if batch == 64)
    ks = _run(policy, rng, 64, low, 1000)
    times = policy._round_times(64, 0)
    probes = [i for i, k in enumerate(ks) if k]
    assert sum(n for (batch, _), n in policy.probed.items() if batch == 64) - before == len(probes)  # counted
    assert 3 <= len(probes) <= 6 and max(ks) <= 4  # the best larger K, never the full span
    gaps = [b - a for a, b in zip([-1, *probes], probes, strict=False)]
    assert all(later >= 1.8 * earlier for earlier, later in zip(gaps, gaps[1:], strict=False))  # doubling
    least = PROBE_LOSS_LEAST / (1.0 - PROBE_FLOOR)
    assert gaps[0] * times[0] >= PROBE_FIRST * least * times[ks[probes[0]]]
    assert _probe_loss(ks, policy, 64) < (1.0 - PROBE_FLOOR) / PROBE_FIRST
    assert _probe_share(ks, times, 0) < 1 / PROBE_FIRST


def test_after_a_high_acceptance_stretch_low_acceptance_at_128_pays_little_for_probes():
    # ca36d9c spaced probes by rounds: 8-draft probes at batch 128 cost the H200 study's `chat` arm ~15 %.
    policy, rng = SpanPolicy(read_cost_table(H200_4B), PER_ROUND), random.Random(0)
    _run(policy, rng, 64, _profile(0.87, 0.78), 300)
    ks = _run(policy, rng, 128, _profile(0.72, 0.63), 600)
    assert policy.k == 0 and _probe_share(ks, policy._round_times(128, 0), 0) < 0.02


def test_no_probe_where_speculation_is_far_behind():
    policy, rng = SpanPolicy(read_cost_table(H200_4B), PER_ROUND), random.Random(0)
    code = _profile(0.87, 0.78)
    _run(policy, rng, 8, code, 50)
    assert set(_run(policy, rng, 256, code, 600)[3:]) == {0}  # the 4B table at 256: 0.62 of the gated value


def test_no_round_verifies_drafts_no_request_may_accept():
    """A batch whose requests have one token left runs the gated round whatever the K in force, and
    one whose most has three left verifies no more than the smallest variant covering two drafts;
    the K in force stays for the next wave (the H200 study at 3cfef9c: stragglers ending a c=256 wave
    in 8- and 15-draft rounds)."""
    policy = SpanPolicy(free_rows(), PER_ROUND)
    policy.conditional = [0.9] * PER_ROUND
    assert policy.decide(70) == PER_ROUND and policy.k == PER_ROUND
    assert policy.decide(70, remaining=[1] * 70, useful=0) == 0
    assert policy.decide(70, remaining=[3] * 70, useful=2) == 2
    assert policy.decide(70, remaining=[4] * 70, useful=3) == 4  # 4 covers three drafts, 2 does not
    assert policy.k == PER_ROUND and policy.decide(70, remaining=[64] * 70, useful=63) == PER_ROUND


def _state(policy: SpanPolicy) -> tuple:
    probes = {key: list(state) for key, state in policy._probes.items()}
    return policy.k, policy._streak, policy._starved, policy._batch, probes, dict(policy.chosen), dict(policy.host.ms)


def test_a_plan_changes_nothing_and_applied_decides_as_decide_does():
    """The engine plans a gated round's successor while the device runs it and applies the plan a
    round later: planning leaves every piece of state as it was, and plan + apply is decide."""
    tables = [costly_drafter(), free_rows(), table(lambda b, s: 4.0 + 0.1 * b * s, lambda b: 0.5 + 0.02 * b, SPANS)]
    for t in tables:
        rng = random.Random(3)
        deciding, planning = SpanPolicy(t, 8), SpanPolicy(t, 8)
        for i in range(400):
            batch = rng.choice([1, 3, 16, 64, 200])
            remaining = [rng.randint(1, 40) for _ in range(batch)] if i % 3 else None
            args = (batch, rng.choice([0, 0, 4]), remaining, rng.randint(0, 8))
            before = _state(planning)
            decision = planning.plan(*args)
            assert _state(planning) == before
            assert planning.apply(decision) == deciding.decide(*args)
            assert _state(planning) == _state(deciding)
            if decision.k:
                accepted = [rng.randint(0, decision.k) for _ in range(batch)]
                for p in (planning, deciding):
                    p.observe([decision.k] * batch, accepted)
            wall = 5.0 + rng.random()
            for p in (planning, deciding):
                p.observe_wall(batch, decision.k, wall)


def test_no_probe_tries_a_k_that_loses_to_the_gated_round_even_with_every_draft_accepted():
    # The H200 study at c1e25cd: 4-draft probes at batch 256 (31 ms against a 5.2 ms gated round plus
    # its 1.5 ms host term), where 4 drafts all accepted still fall short of the gated round.
    acceptance = [0.9] * 4 + [0.3] * (PER_ROUND - 4)  # past 4 drafts too few accepted for a larger probe
    policy = SpanPolicy(read_cost_table(H200_4B), PER_ROUND, prior=acceptance, learn_host=False)
    rng = random.Random(1)
    policy.host.ms[False, 256] = policy.host.ms[True, 256] = 1.5
    times = policy._round_times(256, 0)
    _, values = best_span(times, 256, policy.conditional)
    assert max((k for k in values if k), key=values.get) == 4 and values[4] >= PROBE_FLOOR * values[0]
    assert (1 + 4) / times[4] < 1.05 * 1.05 / times[0]  # all 4 accepted: short of the gated round's value
    assert _run(policy, rng, 256, acceptance, 600) == [0] * 600
