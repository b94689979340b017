"""The cost model's arithmetic on synthetic tables: committed tokens, truncation, interpolation (the
closed-loop replay: test_study_sim.py)."""

from __future__ import annotations

import pytest

from engine.bench.study.model import committed_pmf, truncated_tau
from engine.policy.costs import CostTable, expected_committed

HALF = [0.5] * 4


def table() -> CostTable:
    """verify = 2 ms + 0.01 ms per row; drafter 1 ms + 0.1 ms per request; batches 1, 4, 16."""
    verify = {(b, s): 2.0 + 0.01 * b * s for b in (1, 4, 16) for s in (1, 3, 5)}
    return CostTable(verify, {b: 1.0 + 0.1 * b for b in (1, 4, 16)})


def test_expected_committed_is_one_plus_the_running_products():
    assert expected_committed(HALF, 0) == 1.0
    assert expected_committed(HALF, 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_committed([1.0] * 5, 5) == 6.0
    assert expected_committed([0.9, 0.0, 1.0], 3) == pytest.approx(1.9)
    with pytest.raises(ValueError, match="outside"):
        expected_committed(HALF, 5)


def test_pmf_sums_to_one_and_matches_the_mean():
    pmf = committed_pmf([0.87, 0.8, 0.7], 3)
    assert sum(pmf) == pytest.approx(1.0)
    assert pmf[0] == pytest.approx(0.13) and pmf[3] == pytest.approx(0.87 * 0.8 * 0.7)
    assert sum((n + 1) * p for n, p in enumerate(pmf)) == pytest.approx(expected_committed([0.87, 0.8, 0.7], 3))


def test_truncated_tau_caps_rounds_at_the_tokens_left():
    assert truncated_tau([1.0] * 4, 4, 10) == pytest.approx(10 / 2)  # 5 + 5 tokens: two rounds
    assert truncated_tau([1.0] * 4, 4, 1) == 1.0
    assert truncated_tau([0.0] * 4, 4, 7) == 1.0
    long = truncated_tau(HALF, 4, 10_000)
    assert long == pytest.approx(expected_committed(HALF, 4), rel=1e-3)
    assert truncated_tau(HALF, 4, 8) < long
    with pytest.raises(ValueError, match="tokens"):
        truncated_tau(HALF, 4, 0)


def test_table_lookup_interpolates_between_batches_and_refuses_outside():
    t = table()
    assert t.verify_ms(4, 3) == pytest.approx(2.12)
    assert t.verify_ms(10, 1) == pytest.approx((2.04 + 2.16) / 2)  # halfway between 4 and 16
    assert t.draft_ms(16) == pytest.approx(2.6)
    assert t.round_ms(4, 2) == pytest.approx(1.4 + 2.12)
    assert t.decode_ms(1) == pytest.approx(2.01)  # no plain rows: the span-1 verify
    for bad in (lambda: t.verify_ms(32, 1), lambda: t.verify_ms(1, 9), lambda: CostTable({}).draft_ms(1)):
        with pytest.raises(ValueError):
            bad()


def test_from_rows_reads_profile_csv_rows_and_plain_rows():
    rows = [
        {"kind": "verify", "batch": "1", "span": "1", "ms": "3.0"},
        {"kind": "verify", "batch": "1", "span": "16", "ms": "3.4"},
        {"kind": "draft", "batch": "1", "span": "15", "ms": "0.7"},
    ]
    t = CostTable.from_rows(rows, [{"kind": "verify", "batch": "1", "span": "1", "ms": "2.9"}])
    assert (t.verify_ms(1, 16), t.draft_ms(1), t.decode_ms(1), t.gated_ms(1)) == (3.4, 0.7, 2.9, 3.0)
    with pytest.raises(ValueError, match="unknown kind"):
        CostTable.from_rows([{"kind": "prefill", "batch": 1, "span": 1, "ms": 1}])
    with pytest.raises(ValueError, match="> 0"):
        CostTable.from_rows([{"kind": "verify", "batch": 1, "span": 1, "ms": 0}])


def test_a_head_count_between_two_measured_ones_costs_between_them():
    """CostTable.draft_ms: a measured head count's own ms; between two measured counts (the full head at
    full_heads, 15 here) linear between them; None, below every measured count or at the full: all."""
    rows = [{"kind": "verify", "batch": b, "span": 1, "ms": 5.0} for b in (1, 16)]
    rows += [
        {"kind": "draft", "batch": b, "span": k, "ms": ms} for b in (1, 16) for k, ms in ((2, 1.0), (8, 1.6), (15, 3.0))
    ]
    t = CostTable.from_rows(rows)
    assert t.full_heads == 15 and [t.draft_ms(4, k) for k in (2, 8, None, 15, 16, 1, 0)] == [
        1.0,
        1.6,
        3.0,
        3.0,
        3.0,
        3.0,
        3.0,
    ]
    assert t.draft_ms(4, 5) == pytest.approx(1.3) and t.draft_ms(4, 12) == pytest.approx(1.6 + 1.4 * 4 / 7)
