"""The cost table's context axis (SPEC 10): rows timed at a longer context give each kind and span the ms a
token of context costs one request; a round's cost at mean context c is the table's plus that slope times
batch x (c - the table's context); the policy reads it (at long context the gated round's KV read makes
speculation pay where it does not at short context); the engine's calibration times the second context."""

from __future__ import annotations

import pytest

from engine import Engine, EngineConfig
from engine.policy.costs import CostTable
from engine.policy.span import SpanPolicy
from engine.policy.warmup import LONG_CONTEXT

SPANS = (1, 2, 3, 5, 9, 16)


def rows(context: int, batches=(1, 8, 64), per_token: float = 0.0, row_ms: float = 0.02) -> list[dict]:
    """A weight-bound step of 3 ms, `row_ms` per verify row, and a KV read of `per_token` ms per
    request-token (the same for every span: the span's rows share their request's KV read)."""
    out = []
    for b in batches:
        kv = per_token * b * context
        out += [
            {"kind": "verify", "batch": b, "span": s, "ms": 3.0 + row_ms * b * s + kv, "context": context}
            for s in SPANS
        ]
        out.append({"kind": "draft", "batch": b, "span": 15, "ms": 1.0 + 0.01 * b + kv / 4, "context": context})
    return out


def test_rows_at_a_longer_context_give_the_slope_per_request_token():
    t = CostTable.from_rows(rows(64, per_token=1e-4) + rows(2048, batches=(1, 8), per_token=1e-4))
    assert t.context == 64 and t.verify_ms(8, 5) == pytest.approx(3.0 + 0.02 * 40 + 1e-4 * 8 * 64)
    assert t.kv_ms["verify", 5] == pytest.approx(1e-4) and t.kv_ms["draft", 0] == pytest.approx(1e-4 / 4)
    assert t.verify_ms(8, 5, 8192) - t.verify_ms(8, 5) == pytest.approx(1e-4 * 8 * (8192 - 64))
    assert t.verify_ms(64, 5, 32) == t.verify_ms(64, 5)  # shorter than the table's context: its ms
    assert t.round_ms(8, 4, 4096) == pytest.approx(t.draft_ms(8, 4, 4096) + t.verify_ms(8, 5, 4096))
    assert t.gated_ms(8, 4096) == pytest.approx(t.verify_ms(8, 1, 4096))


def test_a_span_without_its_own_slope_takes_the_nearest_and_no_long_rows_mean_no_axis():
    long = [r for r in rows(2048, batches=(8,), per_token=2e-4) if r["kind"] == "draft" or r["span"] in (1, 16)]
    t = CostTable.from_rows(rows(64, per_token=2e-4) + long)
    assert set(t.kv_ms) == {("verify", 1), ("verify", 16), ("draft", 0)}
    assert t.kv_extra("verify", 3, 8, 1064) == pytest.approx(2e-4 * 8 * 1000)  # span 1's
    flat = CostTable.from_rows(rows(64))
    assert flat.kv_ms == {} and flat.verify_ms(8, 5, 10**6) == flat.verify_ms(8, 5)


def test_the_policy_speculates_at_long_context_where_it_gates_at_short():
    # Verify rows dear (0.2 ms a row at batch 64 x span 16: compute-bound), the KV read 40 ns a token:
    # at 64 tokens the gated round wins; at 8k a round's KV read dwarfs the rows and spans pay again.
    long_rows = rows(4096, batches=(1, 8, 64), per_token=4e-5, row_ms=0.2)
    t = CostTable.from_rows(rows(64, per_token=4e-5, row_ms=0.2) + long_rows)
    short, long = SpanPolicy(t, 15, prior=[0.7] * 15), SpanPolicy(t, 15, prior=[0.7] * 15)
    assert short.decide(64, context=64) == 0
    assert long.decide(64, context=8192) > 0


def test_the_engines_calibration_times_a_second_context(tiny_target, tiny_drafter, tmp_path, monkeypatch, one_thread):
    monkeypatch.setenv("PEGASPEC_CACHE", str(tmp_path))
    engine = Engine(
        EngineConfig(model=str(tiny_target), draft_model=str(tiny_drafter), device="cpu", levers={"policy": "adaptive"})
    )
    table = engine.rounds.policy.table
    assert table.context == 64 and {s for k, s in table.kv_ms if k == "verify"} == set(table.spans())
    assert ("draft", 0) in table.kv_ms and all(v >= 0 for v in table.kv_ms.values())
    assert LONG_CONTEXT > 64
