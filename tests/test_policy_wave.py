"""The draining wave (engine/policy/wave.py): the moments of a round's committed tokens, the expected time
to finish a wave under one K (exact at K=0, against a Monte Carlo of the acceptance model for K>0),
the policy's choice over the wave on the H200 4B table, and the engine passing each request's
remaining tokens only while nothing waits for a slot."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import numpy as np
import pytest

from engine import Engine, EngineConfig, SamplingParams
from engine.bench.closed_loop import closed_loop
from engine.policy.costs import read_cost_table
from engine.policy.span import PROBE_FIRST, SpanPolicy, best_span, round_times, span_candidates
from engine.policy.wave import committed_moments, wave, wave_ms

H200_4B = read_cost_table(Path(__file__).parent / "data" / "policy" / "h200-4b-profile.csv")
CODE = [0.87 - 0.09 * i / 14 for i in range(15)]  # the study's profiles: first -> last position
CHAT = [0.72 - 0.09 * i / 14 for i in range(15)]


def test_committed_moments_are_the_enumerated_ones():
    assert committed_moments(CODE, 0) == (1.0, 0.0)
    rng = random.Random(3)
    rates = [rng.uniform(0.3, 0.95) for _ in range(4)]
    probs = {}  # committed c = 1 + accepted: the first c - 1 drafts accepted, then a miss (or the cap)
    for c in range(1, 6):
        p = np.prod(rates[: c - 1])
        probs[c] = p * (1.0 - rates[c - 1]) if c <= 4 else p
    mean = sum(c * p for c, p in probs.items())
    var = sum(c * c * p for c, p in probs.items()) - mean**2
    assert committed_moments(rates, 4) == pytest.approx((mean, var))


def test_the_k0_wave_is_exact():
    """Every round commits one token: round t runs the requests with more than t tokens left."""
    remaining = [3, 5, 5, 9, 1]
    round_ms = np.array([0.0, 2.0, 2.5, 3.0, 3.5, 4.0])
    want = sum(round_ms[sum(r > t for r in remaining)] for t in range(max(remaining)))
    assert wave_ms(*wave(remaining), round_ms, 1.0, 0.0) == pytest.approx(want)


def simulated_wave_ms(remaining: list[int], round_ms: np.ndarray, rates: list[float], k: int, rng) -> float:
    left, total = list(remaining), 0.0
    while left:
        total += round_ms[len(left)]
        drawn = [1 + sum(itertools.takewhile(bool, (rng.random() < a for a in rates[:k]))) for _ in left]
        left = [r - c for r, c in zip(left, drawn, strict=True) if r > c]
    return total


@pytest.mark.parametrize("k,batch,spread", [(8, 64, 0), (4, 16, 0), (15, 32, 0), (8, 48, 40)])
def test_wave_ms_matches_a_monte_carlo_of_the_acceptance_model(k, batch, spread):
    """The normal approximation of each request's rounds against 150 simulated waves of the H200 4B
    table's round times (lockstep, or remaining spread over 40 tokens): within 5 %."""
    rng = random.Random(k * 1000 + batch)
    policy = SpanPolicy(H200_4B, 15, learn_host=False)
    candidates, device = policy.waves.table(0, batch)
    round_ms = device[candidates.index(k)]
    remaining = [64 - rng.randrange(spread + 1) for _ in range(batch)]
    want = np.mean([simulated_wave_ms(remaining, round_ms, CODE, k, rng) for _ in range(150)])
    got = wave_ms(*wave(remaining), round_ms, *committed_moments(CODE, k))
    assert got == pytest.approx(want, rel=0.05)


def values_at(profile: list[float], batch: int) -> tuple[int, int]:
    """(the per-round choice, the wave's choice) of a fresh policy for a lockstep wave of 64 tokens."""
    policy = SpanPolicy(H200_4B, 15, learn_host=False)
    policy.conditional = list(profile)
    per_round, _ = best_span(policy._round_times(batch, 0), batch, profile)
    wave_values = policy.waves.evaluate([64] * batch, 0, profile)
    return per_round, max(wave_values, key=lambda k: (wave_values[k], -k))


def test_a_draining_wave_gates_where_one_round_would_speculate():
    """`chat` at batch 64: a 3-row span is a hair ahead of the gated round per round, but the wave
    it thins runs its tail at small batches (the H200 study's lockstep cell: plain won there)."""
    assert values_at(CHAT, 64) == (2, 0)


@pytest.mark.parametrize("profile,batch,k", [(CODE, 8, 8), (CODE, 32, 8), (CODE, 64, 8), (CHAT, 32, 4)])
def test_the_wave_keeps_the_wins(profile, batch, k):
    assert values_at(profile, batch)[1] == k


def test_decide_values_the_wave_only_when_told_the_remaining_tokens():
    def decide(remaining):
        policy = SpanPolicy(H200_4B, 15, learn_host=False)
        policy.conditional = list(CHAT)
        return policy.decide(64, remaining=remaining)

    assert decide(None) == 2 and decide([64] * 64) == 0


@pytest.fixture
def calls(monkeypatch):
    seen = []
    real = SpanPolicy.decide

    def spy(self, batch, max_drafts=0, remaining=None, useful=None, context=None):
        seen.append((batch, remaining))
        return real(self, batch, max_drafts, remaining, useful, context)

    monkeypatch.setattr(SpanPolicy, "decide", spy)
    return seen


def adaptive_engine(tiny_target, tiny_drafter) -> Engine:
    config = EngineConfig(
        model=str(tiny_target),
        draft_model=str(tiny_drafter),
        device="cpu",
        max_num_seqs=2,
        levers={"policy": "adaptive"},
        cost_table=H200_4B,
    )
    return Engine(config)


def test_generate_passes_remaining_tokens_once_nothing_waits(tiny_target, tiny_drafter, calls, one_thread):
    """Three requests for two slots: while the third waits the policy sees no remaining tokens; once
    it is admitted (generate() adds nothing more, nothing waits) every decision gets each running
    request's tokens left."""
    engine = adaptive_engine(tiny_target, tiny_drafter)
    engine.generate([[5, 6, 7], [1, 2, 3, 4], [9, 9]], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    assert not engine.no_more_requests
    waiting = [r for b, r in calls if r is None]
    draining = [r for b, r in calls if r is not None]
    assert waiting and draining and calls[0][1] is None  # the third request waited at first
    assert all(len(r) == b and all(0 < x <= 12 for x in r) for b, r in calls if r is not None)
    assert all(r is not None for _, r in calls[calls.index(next(c for c in calls if c[1] is not None)) :])


def test_a_wave_switches_at_once():
    """The K left by the last cell (4) goes on the first wave decision once the gated round is ahead
    by the margin."""
    policy = SpanPolicy(H200_4B, 15, learn_host=False)
    policy.conditional = list(CHAT)
    policy.decide(32)  # K=4 in force, as after a c=32 cell
    assert policy.k == 4
    assert policy.decide(64, remaining=[64] * 64) == 0


def waves(
    policy: SpanPolicy, batch: int, rates: list[float], count: int, rng: random.Random, lefts: list | None = None
) -> list[int]:
    """K per round over `count` lockstep waves of 64 tokens, each request's drafts accepted by
    `rates` (conditional per position); lefts, where given, gets each round's (batch, fewest tokens
    left)."""
    ks = []
    for _ in range(count):
        remaining = [64] * batch
        while remaining:
            k = policy.decide(len(remaining), remaining=remaining)
            ks.append(k)
            if lefts is not None:
                lefts.append((len(remaining), min(remaining)))
            if k:
                accepted = [sum(itertools.takewhile(bool, (rng.random() < a for a in rates[:k]))) for _ in remaining]
                policy.observe([k] * len(remaining), accepted)
            else:
                accepted = [0] * len(remaining)
                policy.gated()
            remaining = [r - 1 - a for r, a in zip(remaining, accepted, strict=True) if r > 1 + a]
    return ks


def test_a_wave_probes_out_of_an_estimate_another_workload_left():
    """`chat` acceptance learnt at c=32, then `code` waves at batch 64 (the H200 study's order): the
    estimate gates batch 64, a probe finds the drafts accepted, and the waves after the first (the
    study's warm-up round) speculate; where the gate is right (`chat` at 96) probes take under 3 %
    of the time beyond the gated rounds they replace, none in a wave's last rounds; at 128 on this
    table no K beats the gated round even at 90 % acceptance per position, and none is probed."""
    rng = random.Random(5)
    policy = SpanPolicy(H200_4B, 15, learn_host=False)
    policy.conditional = list(CHAT)
    ks = waves(policy, 64, CODE, 4, rng)
    later = ks[64:]  # the first wave runs ~60 rounds, most gated
    assert ks[0] == 0 and sum(k >= 4 for k in later) >= 0.8 * len(later)
    policy = SpanPolicy(H200_4B, 15, learn_host=False)
    policy.conditional = list(CHAT)
    lefts: list[tuple[int, int]] = []
    ks = waves(policy, 96, CHAT, 6, rng, lefts)
    times = round_times(H200_4B, 96, span_candidates(15, 0, H200_4B))
    probes = [(k, left) for k, (batch, left) in zip(ks, lefts, strict=True) if k and batch == 96]
    assert probes and all(left >= 4 * (1 + k) for k, left in probes)  # none in a wave's last rounds
    assert sum(times[k] - times[0] for k, _ in probes) <= 0.03 * sum(times[k] for k in ks)
    policy = SpanPolicy(H200_4B, 15, learn_host=False)
    policy.conditional = list(CHAT)
    assert not any(waves(policy, 128, CHAT, 6, rng))


def test_a_probe_near_break_even_comes_early_in_the_first_wave():
    """The H200 study at f4464a4: after `chat` c=32 the estimate put 4 drafts at ~0.85-0.9 of the gated
    round at batch 64 and `code` c=64's first run gated all its rounds: spaced by their ms, the probes
    came due past the point where a wave still takes one. Spaced by their value loss, the first probe
    of such an estimate comes in the wave's first quarter."""
    low_chat = [0.66 - 0.09 * i / 14 for i in range(15)]
    for seed in range(5):
        policy = SpanPolicy(H200_4B, 15, learn_host=False)
        policy.conditional = list(low_chat)
        _, values = best_span(policy._round_times(64, 0), 64, low_chat)
        assert values[4] < 0.92 * values[0] and max(values, key=values.get) == 0
        ks = waves(policy, 64, CODE, 1, random.Random(seed))
        assert next(i for i, k in enumerate(ks) if k) < 16


def test_a_probe_that_can_find_little_waits_its_whole_ms():
    """At batch 112 on this table 4 drafts sit at break-even on the `code` estimate but lead the gated
    round by under 25 % even at 90 % acceptance: its probes keep the spacing by their ms (at 76da6b5
    such probes at `code` c=128, spaced by their small value loss, came three times as often and cost
    those runs 6-7 %)."""
    policy = SpanPolicy(H200_4B, 15, learn_host=False)
    policy.conditional = list(CODE)
    times = policy._round_times(112, 0)
    _, values = best_span(times, 112, CODE)
    assert 0.98 < values[4] / values[0] < 1.05 and (1 - 0.9**5) / 0.1 / times[4] * times[0] < 1.25
    ks = waves(policy, 112, CODE, 3, random.Random(1))
    first = next(i for i, k in enumerate(ks) if k)
    assert first * times[0] >= PROBE_FIRST * times[ks[first]]


def test_a_server_loop_never_drains_a_closed_loop_drains_its_last_wave(tiny_target, tiny_drafter, calls, one_thread):
    """add_request + step, as the server's loop runs the engine: more may come, so no decision gets
    remaining tokens even with nothing waiting. The bench's closed loop (2 slots, 4 requests) tells
    the engine once it has submitted the last: only then."""
    engine = adaptive_engine(tiny_target, tiny_drafter)
    for prompt in ([5, 6, 7], [1, 2, 3, 4]):
        engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    assert calls and all(r is None for _, r in calls)
    calls.clear()
    closed_loop(engine, [[5, 6, 7], [1, 2, 3, 4], [9, 9], [4, 4, 4]], 2, 4, [12, 5, 12, 12])
    given = [r is not None for _, r in calls]
    assert given[0] is False and given[-1] is True and given == sorted(given)  # none, then from the last wave
    assert not engine.no_more_requests


def test_the_probe_spacing_outlives_a_load_that_moves_k():
    """`chat` waves at batch 32 (K=4) and 64 (gated) in turn, as the study's cells run: the spacing of
    the probes at 64 keeps growing across the waves between (kept per K alone, it restarted at every
    switch and each 64-wave probed: 12 probes in these 8 waves). Here 2 drafts are valued level with
    the gated round, so its probes give up little and come due at a third of their ms."""
    rng = random.Random(5)
    policy = SpanPolicy(H200_4B, 15, learn_host=False)
    policy.conditional = list(CHAT)
    probes = []
    for _ in range(8):
        waves(policy, 32, CHAT, 1, rng)
        lefts: list[tuple[int, int]] = []
        ks = waves(policy, 64, CHAT, 1, rng, lefts)
        probes.append(sum(1 for k, (batch, _) in zip(ks, lefts, strict=True) if k and batch == 64))
    assert probes[0] >= 1 and sum(probes) <= 5 and sum(probes[4:]) <= 1


def test_an_estimate_that_moves_k_at_one_batch_probes_afresh():
    policy = SpanPolicy(H200_4B, 15, learn_host=False)
    policy.conditional = list(CHAT)
    assert policy.decide(96) == 0
    policy._probes[7, 0] = [0.0, 512]  # a long spacing at batch 64-127 under K = 0
    policy._probes[6, 0] = [0.0, 512]  # and at 32-63
    policy.conditional = list(CODE)  # acceptance rose: K moves at the same batch
    ks = [policy.decide(96) for _ in range(4)]
    assert ks[-1] == 4 and (7, 0) not in policy._probes and policy._probes[6, 0][1] == 512
