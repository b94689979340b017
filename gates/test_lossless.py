"""Lossless child tests: speculative greedy equals plain greedy on the same engine weights.

The levers gate (test_spec_levers.py) re-runs these in subprocesses with PEGAINFER_SPEC_* set and
reads their per-round trace.
"""

from __future__ import annotations

import pytest

from gates.lossless import TOKENS, Tally, batch_invariant, build_engines, check, gate_prompts, greedy


@pytest.fixture(scope="module")
def engines(gate_weights):
    return build_engines(gate_weights)


def _prompt_ids(engine, prompt: str) -> list[int]:
    return list(engine.tokenizer.encode(prompt, add_special_tokens=False))


def test_greedy_matches_plain_greedy(engines, gate_weights):
    plain, spec = engines
    tally = Tally()
    for prompt in gate_prompts(gate_weights.label, 5):
        ids = _prompt_ids(plain, prompt)
        (want,) = plain.generate([ids], greedy(TOKENS))
        (got,) = spec.generate([ids], greedy(TOKENS))
        check(plain, ids, want.token_ids, got.token_ids, tally, batch_invariant())
    assert spec.stats.rounds > 0, "the speculative engine never ran a verify round"
    print(tally.line("greedy_matches_plain_greedy"))


def test_concurrent_heterogeneous_is_lossless(engines, gate_weights):
    plain, spec = engines
    budgets = (64, 24, 48, 40)  # staggered: the batch shrinks mid-run
    prompts = [_prompt_ids(plain, p) for p in gate_prompts(gate_weights.label, len(budgets))]
    rounds_before = spec.stats.rounds
    outs = spec.generate(prompts, [greedy(b) for b in budgets])
    tally = Tally()
    for ids, budget, got in zip(prompts, budgets, outs, strict=True):
        (want,) = plain.generate([ids], greedy(budget))
        check(plain, ids, want.token_ids, got.token_ids, tally, batch_invariant())
        assert len(got.token_ids) == budget
    assert spec.stats.rounds > rounds_before, "the speculative engine never ran a verify round"
    print(tally.line("concurrent_heterogeneous_is_lossless"))


def test_short_then_long_verify_capture_is_lossless(engines, gate_weights):
    plain, spec = engines
    short, long = (_prompt_ids(plain, p) for p in gate_prompts(gate_weights.label, 2))
    tally = Tally()
    # The short request captures short-span verify graphs first; the long one must not replay them.
    for ids, budget in ((short, 4), (long, TOKENS)):
        (got,) = spec.generate([ids], greedy(budget))
        (want,) = plain.generate([ids], greedy(budget))
        check(plain, ids, want.token_ids, got.token_ids, tally, batch_invariant())
    print(tally.line("short_then_long_verify_capture_is_lossless"))
