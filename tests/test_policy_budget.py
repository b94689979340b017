"""policy=budget (engine/policy/budget.py): the chooser's K_i on hand-made cost tables and survival
vectors against a brute-force argmax, its caps and gate, the per-request estimator's update, and the
engine end to end on the shipped tiny pair (lossless against plain greedy, K mixed within a round)."""

from __future__ import annotations

import itertools
from operator import mul
from types import SimpleNamespace

import numpy as np
import pytest

from engine import Engine, EngineConfig, SamplingParams
from engine.policy.budget import RequestAcceptance, budget_spans, request_caps
from engine.policy.span import SPEC_DISCOUNT, SpanPolicy
from tests.policy_tables import table
from trace_tools import hedge_trace_rows, levers_trace_rows, summarize_hedge


def linear(per_slot: float, base: float = 10.0, draft: float = 2.0, spans=range(1, 9)):
    """verify ms = base + per_slot * (rows - batch): each draft slot costs per_slot ms."""
    return table(lambda b, s: base + per_slot * b * (s - 1), lambda b: draft, spans)


def brute_force(t, survival: np.ndarray, caps) -> list[int]:
    """The argmax over every B of (N + top-B survival) / (draft + verify at span 1 + B/N), by loops."""
    n, p = survival.shape
    slots = sorted((-survival[i, j], j, i) for i in range(n) for j in range(min(caps[i], p)))
    spans = t.spans()
    best, best_value, best_ks = -1, -1.0, [0] * n
    for b in range(len(slots) + 1):
        taken = slots[:b]
        ks = [sum(1 for _, _, i in taken if i == r) for r in range(n)]
        span = 1 + b / n
        lo = max(s for s in spans if s <= span)
        hi = min(s for s in spans if s >= span)
        v_lo, v_hi = t.verify_ms(n, lo), t.verify_ms(n, hi)
        verify = v_lo if hi == lo else v_lo + (v_hi - v_lo) * (span - lo) / (hi - lo)
        ms = verify + (t.draft_ms(n, max(ks)) if b else 0.0)
        value = (n - sum(s for s, _, _ in taken)) / ms / (1 + SPEC_DISCOUNT if b else 1)
        if value > best_value + 1e-12:
            best, best_value, best_ks = b, value, ks
    assert best >= 0
    return best_ks


def survival_of(conditional) -> np.ndarray:
    return np.cumprod(np.asarray(conditional, dtype=np.float64), axis=1)


@pytest.mark.parametrize("per_slot", [0.05, 0.3, 0.8])
@pytest.mark.parametrize("seed", range(4))
def test_the_chooser_takes_the_argmax_budget(per_slot, seed):
    rng = np.random.default_rng(seed)
    n = 1 + seed * 3
    survival = survival_of(rng.uniform(0.2, 1.0, size=(n, 7)))
    t, caps = linear(per_slot, spans=(1, 2, 3, 5, 8)), request_caps([50] * n, 7, 0)
    ks, _ = budget_spans(t, survival, caps)
    assert ks == brute_force(t, survival, caps)


def test_a_mid_cost_mixes_k_by_acceptance():
    survival = survival_of([[0.95] * 7, [0.3] * 7, [0.7] * 7])
    ks, device = budget_spans(linear(0.3), survival, [7, 7, 7])
    assert ks[0] > ks[2] > ks[1] and ks == brute_force(linear(0.3), survival, [7, 7, 7])
    assert device == pytest.approx(2.0 + 10.0 + 0.3 * sum(ks))


def test_max_drafts_and_the_budget_cap_every_request():
    assert request_caps([50, 3, 1, 0], 7, 4).tolist() == [4, 2, 0, 0]
    assert request_caps([50, 50], 7, 0).tolist() == [7, 7] and request_caps([50], 7, 9).tolist() == [7]
    survival = survival_of([[1.0] * 7, [0.99] * 7, [1.0] * 7])
    ks, _ = budget_spans(linear(0.01), survival, request_caps([50, 50, 3], 7, 4))
    assert ks == [4, 4, 2]


def test_the_widest_measured_span_caps_k():
    ks, _ = budget_spans(linear(0.01, spans=(1, 2, 3, 5)), survival_of([[1.0] * 7] * 2), [7, 7])
    assert ks == [4, 4]


def test_a_dear_verify_or_drafter_gives_budget_zero():
    survival = survival_of([[0.9] * 7] * 4)
    assert budget_spans(linear(5.0), survival, [7] * 4)[0] == [0] * 4
    assert budget_spans(linear(0.01, draft=100.0), survival, [7] * 4)[0] == [0] * 4
    assert budget_spans(linear(0.01), survival, [0] * 4)[0] == [0] * 4  # no request may take a draft


def test_a_host_term_moves_the_choice():
    survival = survival_of([[0.8] * 7] * 2)
    free, _ = budget_spans(linear(0.3), survival, [7, 7])
    assert max(free) > 0
    assert budget_spans(linear(0.3), survival, [7, 7], host=(0.0, 50.0))[0] == [0, 0]


@pytest.mark.parametrize(("a", "per_slot"), [(0.9, 0.3), (0.7, 0.3), (0.95, 0.05), (0.5, 0.8)])
def test_equal_acceptances_give_a_uniform_k(a, per_slot):
    for n in (1, 2, 5, 16):
        ks, _ = budget_spans(linear(per_slot), survival_of([[a] * 7] * n), [7] * n)
        assert len(set(ks)) == 1, (n, ks)
    ks, _ = budget_spans(linear(0.3), survival_of([[0.8] * 7] * 4), [7] * 4)
    assert 0 < ks[0] < 7  # uniform, and neither end


def test_the_estimator_learns_each_request_apart_from_the_pool():
    class R:
        def __init__(self, index, slot):
            self.index, self.slot = index, slot

    est, pooled = RequestAcceptance(4, ema=0.5, relax=0.1), [0.8, 0.6, 0.4, 0.2]
    a, b = R(0, 0), R(1, 3)
    slots = est.slots([a, b], pooled)
    assert np.allclose(est.cols.T[slots], [pooled, pooled])  # seeded from the pool
    tried, hits = est.observe(slots, limits=[4, 2], accepted=[1, 2], pooled=pooled)
    assert tried == [2, 2, 0, 0] and hits == [2, 1, 0, 0]  # the pooled estimate's counts
    row_a, row_b = est.cols.T[est.slots([a, b], pooled)]
    # a: position 1 accepted, 2 rejected (tried), 3 and 4 untried: relaxed toward the pool (no move)
    assert row_a.tolist() == pytest.approx([0.9, 0.3, 0.4, 0.2])
    assert row_b.tolist() == pytest.approx([0.9, 0.8, 0.4, 0.2])  # its limit 2: both tried, accepted
    est.observe(est.slots([a], pooled), limits=[0], accepted=[0], pooled=[1.0] * 4)  # gated: all relax
    relaxed = [c + 0.1 * (1.0 - c) for c in (0.9, 0.3, 0.4, 0.2)]
    assert est.cols.T[0].tolist() == pytest.approx(relaxed)
    assert est.survival(est.slots([a], pooled))[0].tolist() == pytest.approx(list(itertools.accumulate(relaxed, mul)))
    c = R(2, 0)  # a new request in a's slot starts from the pool
    assert est.cols.T[est.slots([c], pooled)][0].tolist() == pooled


def test_the_pooled_estimate_learns_alike_under_budget_and_adaptive():
    """The estimator's counts are Python ints, as `SpanPolicy.observe` counts them: the pooled estimate
    moves to the same bits from either policy's view of the same rounds."""
    rng = np.random.default_rng(5)
    budget, adaptive = SpanPolicy(linear(0.3), 7), SpanPolicy(linear(0.3), 7)
    est = RequestAcceptance(7)
    reqs = [SimpleNamespace(slot=i, index=i) for i in range(128)]
    for _ in range(100):
        limits = rng.integers(0, 8, size=len(reqs)).tolist()
        accepted = [int(rng.integers(0, lim + 1)) for lim in limits]
        slots = est.slots(reqs, budget.conditional)
        budget.observe_counts(*est.observe(slots, limits, accepted, budget.conditional))
        adaptive.observe(limits, accepted)
        assert budget.conditional == adaptive.conditional


PROMPTS = ["def main():\n", "import os\n", "class Config:\n", "# Copyright", "for i in range(10):\n", "x = "]


def budget_engine(target, drafter, **levers) -> Engine:
    config = EngineConfig(
        model=str(target),
        draft_model=str(drafter),
        device="cpu",
        max_num_seqs=8,
        trace=True,
        levers={"policy": "budget", "max_drafts": 6, **levers},
        cost_table=linear(0.3),
    )
    return Engine(config)


def rounds_of(rows):
    """A round's lines are consecutive, one per request: a request seen again starts the next round."""
    rounds, current = [], {}
    for r in rows:
        if r.request in current:
            rounds.append(current)
            current = {}
        current[r.request] = r
    return [*rounds, current]


@pytest.fixture(scope="module")
def plain(shipped_tiny):
    return Engine(EngineConfig(model=str(shipped_tiny[0]), device="cpu", max_num_seqs=8))


def test_the_engine_mixes_k_within_a_round_and_stays_lossless(shipped_tiny, plain, capsys, one_thread):
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, logprobs=2)
    want = plain.generate(PROMPTS, [params] * len(PROMPTS))
    spec = budget_engine(*shipped_tiny)
    capsys.readouterr()
    heads, draft = [], spec.runner.draft
    spec.runner.draft = lambda reqs, k=None: heads.append(k) or draft(reqs, k)
    got = spec.generate(PROMPTS, [params] * len(PROMPTS))
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    for g, w in zip(got, want, strict=True):  # each committed token's logprob from its own span's row
        g, w = g.outputs[0], w.outputs[0]
        assert [p[t].logprob for t, p in zip(g.token_ids, g.logprobs, strict=True)] == pytest.approx(
            [p[t].logprob for t, p in zip(w.token_ids, w.logprobs, strict=True)], abs=1e-4
        )
    rows = levers_trace_rows(capsys.readouterr().err.splitlines())
    assert rows and all(r.verified_draft <= r.span_limit <= 6 for r in rows)
    mixed = [rd for rd in rounds_of(rows) if len({r.span_limit for r in rd.values() if not r.gated}) > 1]
    assert mixed, "no round verified different K for its requests"
    # each round drafts exactly the widest K_i it verifies (a ragged round too: the chooser's drafter ms)
    assert heads == [
        max(r.span_limit for r in rd.values()) for rd in rounds_of(rows) if not all(r.gated for r in rd.values())
    ]
    assert any(r.accepted_draft for rd in mixed for r in rd.values())


def test_hedged_rounds_under_the_budget_stay_lossless(shipped_tiny, plain, capsys, one_thread):
    from engine.shipped import shipped_dspark

    dspark = shipped_dspark("tiny")
    if not (dspark / "config.json").is_file():
        pytest.skip("the fixture's drafter-dspark is not built (python -m engine.fixture markov)")
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    want = [o.token_ids for o in plain.generate(PROMPTS, [params] * len(PROMPTS))]
    spec = budget_engine(shipped_tiny[0], dspark, hedge=8, hedge_positions=(0, 1, 2))
    capsys.readouterr()
    assert [o.token_ids for o in spec.generate(PROMPTS, [params] * len(PROMPTS))] == want
    err = capsys.readouterr().err.splitlines()
    assert summarize_hedge(hedge_trace_rows(err)).chains > 0
    assert all(r.verified_draft <= r.span_limit <= 6 for r in levers_trace_rows(err))


@pytest.mark.parametrize(("n", "p"), [(1, 7), (3, 7), (16, 15), (5, 4)])
def test_under_graphs_a_ragged_verify_is_valued_at_its_padded_span(n, p):
    """span_costs(padded=True): B >= 1 draft slots cost the verify of the least ragged span S with n x S >=
    n + B rows (a graph's row bucket, engine/ragged.py), never less than the exact rows; B = 0 span 1."""
    from engine.kernels.span_meta import ragged_spans
    from engine.policy.budget import span_costs

    t = linear(0.3, spans=(1, 2, 3, 5, 8, 9, 16))
    spans, verify, _, exact, padded, _ = span_costs(t, n, p, padded=True)
    want = [1.0] + [min(s for s in ragged_spans(p) if n * s >= n + b) for b in range(1, n * p + 1)]
    assert padded.tolist() == np.interp(want, spans, verify).tolist() and (padded >= exact).all()
    assert span_costs(t, n, p)[4].tolist() == exact.tolist()  # eager: the exact rows


def test_under_graphs_the_chooser_fills_the_rows_it_pays_for():
    """Two requests that accept well, two less so, verify rows at 0.3 ms a slot: on exact rows the chooser
    verifies 24 rows, which a graph runs as 4 x 8 (the least ragged span holding them); valuing the rows
    it would run, it takes a round whose rows fill their bucket (4 x 5)."""
    from engine.kernels.span_meta import ragged_spans
    from engine.policy.budget import span_costs

    t = linear(0.3, spans=(1, 2, 3, 5, 8))
    survival = survival_of([[0.95] * 7, [0.95] * 7, [0.7] * 7, [0.7] * 7])
    assert budget_spans(t, survival, [7] * 4)[0] == [7, 7, 3, 3]  # 24 rows: padded to 4 x 8 under graphs
    ks, ms = budget_spans(t, survival, [7] * 4, costs=span_costs(t, 4, 7, padded=True))
    assert ks == [7, 7, 1, 1] and 4 + sum(ks) in {4 * s for s in ragged_spans(7)} and ms == t.verify_ms(4, 5) + 2.0
