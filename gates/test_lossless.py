"""Lossless child tests: speculative greedy equals plain greedy on the same engine weights, token by
token against the target's own choice.

The levers gate (test_spec_levers.py) re-runs these in subprocesses with PEGAINFER_SPEC_* set, reads
their per-round trace and cross-checks it against the `DFlash request` line each prints per request.
"""

from __future__ import annotations

import pytest

from gates.lossless import TOKENS, Tally, batch_invariant, build_engines, check, gate_prompts, greedy, request_line

STOP_AT = (6, 14, 25, 40)  # output positions whose plain-greedy token becomes the stop token


@pytest.fixture(scope="module")
def engines(gate_weights):
    return build_engines(gate_weights)


def _prompt_ids(engine, prompt: str) -> list[int]:
    return list(engine.tokenizer.encode(prompt, add_special_tokens=False))


def _report(out, max_tokens: int) -> None:
    print(request_line(out.request_id, len(out.prompt_token_ids), len(out.token_ids), max_tokens))


def test_greedy_matches_plain_greedy(engines, gate_weights):
    plain, spec = engines
    tally, exact = Tally(), batch_invariant()
    for prompt in gate_prompts(gate_weights.label, 5):
        ids = _prompt_ids(plain, prompt)
        (want,) = plain.generate([ids], greedy(TOKENS))
        (got,) = spec.generate([ids], greedy(TOKENS))
        _report(got, TOKENS)
        check(plain, ids, want.token_ids, got.token_ids, tally, exact, TOKENS, request=got.request_id)
    assert spec.stats.rounds > 0, "the speculative engine never ran a verify round"
    tally.report("greedy_matches_plain_greedy")


def test_concurrent_heterogeneous_is_lossless(engines, gate_weights):
    plain, spec = engines
    budgets = (64, 24, 48, 40)  # staggered: the batch shrinks mid-run
    prompts = [_prompt_ids(plain, p) for p in gate_prompts(gate_weights.label, len(budgets))]
    rounds_before = spec.stats.rounds
    outs = spec.generate(prompts, [greedy(b) for b in budgets])
    tally, exact = Tally(), batch_invariant()
    for ids, budget, got in zip(prompts, budgets, outs, strict=True):
        _report(got, budget)
        (want,) = plain.generate([ids], greedy(budget))
        check(plain, ids, want.token_ids, got.token_ids, tally, exact, budget, request=got.request_id)
    assert spec.stats.rounds > rounds_before, "the speculative engine never ran a verify round"
    tally.report("concurrent_heterogeneous_is_lossless")


def test_stop_tokens_end_like_plain_decode(engines, gate_weights):
    """Stop tokens on (EOS too): a stop token inside an accepted run must end the request right there,
    exactly where plain decode ends it."""
    plain, spec = engines
    tally, exact = Tally(), batch_invariant()
    for prompt in gate_prompts(gate_weights.label, 5):
        ids = _prompt_ids(plain, prompt)
        (free,) = plain.generate([ids], greedy(TOKENS))
        for at in STOP_AT:
            token = free.token_ids[at]
            if token in free.token_ids[:at]:
                continue  # it would stop earlier: another position covers that
            params = greedy(TOKENS, stop=[token])
            (want,) = plain.generate([ids], params)
            (got,) = spec.generate([ids], params)
            _report(got, TOKENS)
            stops = {token, *plain.eos_ids}
            check(plain, ids, want.token_ids, got.token_ids, tally, exact, TOKENS, stops, request=got.request_id)
    assert tally.requests > 0, "no stop token to place: every candidate repeats earlier in its output"
    tally.report("stop_tokens_end_like_plain_decode")


def test_short_then_long_verify_capture_is_lossless(engines, gate_weights):
    plain, spec = engines
    short, long = (_prompt_ids(plain, p) for p in gate_prompts(gate_weights.label, 2))
    tally, exact = Tally(), batch_invariant()
    # The short request captures short-span verify graphs first; the long one must not replay them.
    for ids, budget in ((short, 4), (long, TOKENS)):
        (got,) = spec.generate([ids], greedy(budget))
        (want,) = plain.generate([ids], greedy(budget))
        check(plain, ids, want.token_ids, got.token_ids, tally, exact, budget, request=got.request_id)
    tally.report("short_then_long_verify_capture_is_lossless")
