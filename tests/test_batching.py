"""Continuous batching: a request's tokens do not depend on what shares its steps."""

from __future__ import annotations

import pytest

from engine import Engine, EngineConfig, SamplingParams

PROMPTS = [[5, 6, 7, 8, 9, 10], [1, 2, 3], list(range(20, 60)), [7] * 9, [100, 200, 150, 42, 42, 8, 1]]
BUDGETS = [30, 7, 19, 24, 12]


@pytest.fixture(scope="module")
def engine(tiny_target):
    return Engine(EngineConfig(model=str(tiny_target), device="cpu", max_num_seqs=3))


def test_heterogeneous_batch_equals_each_alone(engine):
    params = [SamplingParams(temperature=0, max_tokens=b, ignore_eos=True) for b in BUDGETS]
    together = engine.generate(PROMPTS, params)  # max_num_seqs=3: admission waits for slots
    for prompt, p, out in zip(PROMPTS, params, together, strict=True):
        (alone,) = engine.generate([prompt], p)
        assert out.token_ids == alone.token_ids
        assert len(out.token_ids) == p.max_tokens


def test_seeded_sampling_is_reproducible_and_differs_from_greedy(engine):
    sampled = SamplingParams(max_tokens=20, temperature=1.0, top_k=50, top_p=0.9, seed=7, ignore_eos=True)
    a = engine.generate(PROMPTS[:2], sampled)
    b = engine.generate(PROMPTS[:2], sampled)
    greedy = engine.generate(PROMPTS[:2], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert [o.token_ids for o in a] != [o.token_ids for o in greedy]


def test_stop_token_ends_the_request(engine):
    (free,) = engine.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    stop = free.token_ids[10]
    first = free.token_ids.index(stop)
    (out,) = engine.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=30, stop_token_ids=(stop,)))
    assert out.token_ids == free.token_ids[: first + 1]
    assert out.finish_reason == "stop"


def test_step_api_streams_new_tokens(engine):
    rid = engine.add_request(PROMPTS[1], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    seen = []
    while engine.has_unfinished():
        for out in engine.step():
            assert out.request_id == rid
            seen += out.new_token_ids
    assert len(seen) == 5 and seen == out.token_ids and out.finished
