"""Lossless child tests: speculative greedy equals plain greedy on the same engine weights, token by
token against the target's own choice.

The levers gate (test_spec_levers.py) re-runs these in subprocesses with PEGAINFER_SPEC_* set, reads
their per-round trace and cross-checks it against the `DFlash request` line each prints per request.
"""

from __future__ import annotations

import dataclasses

import pytest

from engine import SamplingParams
from engine.sampler import filtered_probs
from gates.lossless import (
    TOKENS,
    Tally,
    batch_invariant,
    build_engines,
    check,
    fail,
    gate_prompts,
    greedy,
    penalize,
    request_line,
)

STOP_AT = (6, 14, 25, 40)  # output positions whose plain-greedy token (or text) becomes the stop
# The arrivals child: one long request alone, a wave of short ones arriving once it has run ARRIVE_AFTER
# rounds (past the auto-hedge controller's first 64-round window), then the long one alone again.
LONG, WAVE, ARRIVE_AFTER = 320, 24, 70
# vLLM's penalties, one set per request of the penalties child (a batch of mixed params). Repetition
# also hits the prompt's tokens, so only presence and frequency make a round's earlier drafts count
# (the canary that drops them is caught on the first request on the tiny pair).
PENALTIES = (
    dict(presence_penalty=1.0, frequency_penalty=0.5),
    dict(presence_penalty=0.6, frequency_penalty=0.4, repetition_penalty=1.3),
    dict(presence_penalty=1.5, frequency_penalty=0.5),
    dict(frequency_penalty=1.0, repetition_penalty=1.1),
)


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


def _free_runs(plain, label: str, count: int):
    """(prompt ids, plain greedy's TOKENS-token output) of each of the first `count` gate prompts."""
    for prompt in gate_prompts(label, count):
        ids = _prompt_ids(plain, prompt)
        (free,) = plain.generate([ids], greedy(TOKENS))
        yield ids, free.token_ids


def test_stop_tokens_end_like_plain_decode(engines, gate_weights):
    """Stop tokens on (EOS too): a stop token inside an accepted run must end the request right there,
    exactly where plain decode ends it."""
    plain, spec = engines
    tally, exact = Tally(), batch_invariant()
    for ids, free in _free_runs(plain, gate_weights.label, 5):
        for at in STOP_AT:
            token = free[at]
            if token in free[:at]:
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


def _stop_string(plain, tokens: list[int], at: int) -> str | None:
    """A few characters of plain's text that token `at` completes and that appear nowhere before."""
    text = plain.tokenizer.decode(tokens[: at + 1], skip_special_tokens=True)
    before = plain.tokenizer.decode(tokens[:at], skip_special_tokens=True).rstrip("\ufffd")
    if "\ufffd" in text or not text.startswith(before) or len(text) == len(before):
        return None
    for width in (3, 4, 2, 5):
        stop = text[-width:]
        if len(text) >= width and text.find(stop) == len(text) - width and stop.strip():
            return stop
    return None


def test_stop_strings_end_like_plain_decode(engines, gate_weights):
    """Stop strings: one completed inside an accepted run must end the output at the token that
    completes it, with the text cut before it, exactly as plain decode does."""
    plain, spec = engines
    tally, exact = Tally(), batch_invariant()
    for ids, free in _free_runs(plain, gate_weights.label, 3):
        for at in STOP_AT:
            stop = _stop_string(plain, free, at)
            if stop is None:
                continue
            params = SamplingParams(temperature=0, max_tokens=TOKENS, ignore_eos=True, stop=[stop])
            (want,) = plain.generate([ids], params)
            (got,) = spec.generate([ids], params)
            _report(got, TOKENS)
            check(
                plain,
                ids,
                want.token_ids,
                got.token_ids,
                tally,
                exact,
                TOKENS,
                request=got.request_id,
                stop_strings=[stop],
            )
            # Past a near-tie the check excused (bf16 on a GPU) the outputs differ by right and the stop
            # string need not recur: the text is plain decode's wherever the tokens are.
            if got.token_ids == want.token_ids and got.text != want.text:
                fail(f"{got.request_id} text {got.text!r} is not plain decode's {want.text!r} (stop {stop!r})")
    assert tally.requests > 0, "no stop string to place: no candidate is new text at its position"
    tally.report("stop_strings_end_like_plain_decode")


def test_arrivals_mid_run_are_lossless(engines, gate_weights):
    """Requests arriving mid-run: a long request speculates alone, a wave of short ones joins it (under
    MAX_BATCH=3 the batch gates while they run), then it speculates alone again."""
    plain, spec = engines
    long, *wave = (_prompt_ids(plain, p) for p in gate_prompts(gate_weights.label, 4))
    start, budgets = spec.stats.rounds, {}
    budgets[spec.add_request(long, greedy(LONG))] = (long, LONG)
    done = {}
    while spec.has_unfinished():
        done |= {o.request_id: o for o in spec.step() if o.finished}
        if len(budgets) == 1 and spec.stats.rounds - start >= ARRIVE_AFTER:
            budgets |= {spec.add_request(ids, greedy(WAVE)): (ids, WAVE) for ids in wave}
    assert len(budgets) == 1 + len(wave), f"the long request ended before {ARRIVE_AFTER} rounds"
    tally, exact = Tally(), batch_invariant()
    for rid, (ids, budget) in budgets.items():
        got = done[rid]
        _report(got, budget)
        (want,) = plain.generate([ids], greedy(budget))
        check(plain, ids, want.token_ids, got.token_ids, tally, exact, budget, request=rid)
    tally.report("arrivals_mid_run_are_lossless")


def test_penalties_and_min_p_are_lossless(engines, gate_weights):
    """Presence, frequency and repetition penalties, greedy, staggered requests at once: every verify
    row counts the drafts before it, so each token is the target's penalized choice after the same
    prefix. Then min_p with the penalties, seeded sampling: each token lies in plain decode's own
    min_p support after the same prefix."""
    plain, spec = engines
    budgets = (64, 24, 48, 40)  # staggered: the batch shrinks mid-run (MAX_BATCH=3 resumes)
    prompts = [_prompt_ids(plain, p) for p in gate_prompts(gate_weights.label, len(budgets))]
    rounds_before = spec.stats.rounds
    params = [
        SamplingParams(temperature=0, max_tokens=b, ignore_eos=True, **pen)
        for b, pen in zip(budgets, PENALTIES, strict=True)
    ]
    tally, exact, bitten = Tally(), batch_invariant(), 0
    for ids, p, got in zip(prompts, params, spec.generate(prompts, params), strict=True):
        _report(got, p.max_tokens)
        (want,) = plain.generate([ids], p)
        check(
            plain, ids, want.token_ids, got.token_ids, tally, exact, p.max_tokens, request=got.request_id, penalties=p
        )
        bitten += want.token_ids != plain.generate([ids], greedy(p.max_tokens))[0].token_ids
    assert bitten, "the penalties never changed plain greedy's output: the check has no power"
    sampled = SamplingParams(temperature=0.8, min_p=0.2, max_tokens=32, ignore_eos=True, **PENALTIES[1])
    seeded = [dataclasses.replace(sampled, seed=7 + i) for i in range(2)]
    for ids, p, got in zip(prompts[:2], seeded, spec.generate(prompts[:2], seeded), strict=True):
        _report(got, p.max_tokens)
        _check_support(plain, ids, got.token_ids, p, tally, got.request_id)
    assert spec.stats.rounds > rounds_before, "the speculative engine never ran a verify round"
    tally.report("penalties_and_min_p_are_lossless")


def _check_support(plain, ids: list[int], got: list[int], params: SamplingParams, tally: Tally, request: str) -> None:
    """Fail unless every sampled token has a nonzero probability in plain decode's distribution after
    the same prefix (penalties, temperature, min_p) and the output ran to max_tokens."""
    tally.requests += 1
    for j, token in enumerate(got):
        probs = filtered_probs(penalize(plain.last_logits(ids + got[:j]), ids, got[:j], params), params)
        if not probs[token] > 0:
            kept = int((probs > 0).sum())
            fail(f"{request} output token {j}: {token} is outside plain decode's min_p support ({kept} tokens)")
    if len(got) != params.max_tokens:
        fail(f"{request} output ends after {len(got)} of {params.max_tokens} tokens")
    tally.compared_tokens += len(got)
