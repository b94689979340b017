"""The prefill step (engine/prefill.py): its token buckets, and on the GPU the graphed prefill against
the eager one (logits of the first token, the K/V the decode then reads)."""

from __future__ import annotations

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.prefill import PREFILL_GRAPH_TOKENS, prefill_bucket


def test_token_buckets_pad_at_most_a_quarter_past_256():
    assert [prefill_bucket(t) for t in (1, 16, 17, 48, 200, 256)] == [16, 16, 32, 64, 256, 256]
    assert [prefill_bucket(t) for t in (257, 700, 1100, PREFILL_GRAPH_TOKENS)] == [512, 768, 1280, 2048]
    assert prefill_bucket(PREFILL_GRAPH_TOKENS + 1) is None
    for t in range(257, PREFILL_GRAPH_TOKENS + 1, 37):
        assert t <= prefill_bucket(t) < 1.25 * t + 256 and prefill_bucket(t) % 256 == 0


def _engine(target, drafter, graphs: bool) -> Engine:
    options = {"device": "cuda", "backend": "triton", "dtype": "float32", "max_num_seqs": 17}
    return Engine(EngineConfig(model=str(target), draft_model=str(drafter), cuda_graphs=graphs, **options))


PROMPTS = [[5, 6, 7, 8, 9, 10], [1, 2, 3], list(range(20, 60)), [7] * 9, [100, 200, 150, 42, 42, 8, 1]]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_graphed_prefill_matches_the_eager_one(tiny_target, tiny_drafter):
    """Prefills of 1, 3 and 9 prompts replay graphs of their buckets (requests 1, 4, 16): the first
    token's log-probabilities match the eager prefill's, and so do the tokens decoded after it (the
    K/V and drafter context the graphed prefill wrote)."""
    graphed, eager = _engine(tiny_target, tiny_drafter, True), _engine(tiny_target, tiny_drafter, False)
    for n in (1, 3, 9):
        prompts = [PROMPTS[i % len(PROMPTS)] + [i] for i in range(n)]
        first = SamplingParams(max_tokens=1, logprobs=3, ignore_eos=True)
        for got, want in zip(graphed.generate(prompts, first), eager.generate(prompts, first), strict=True):
            assert got.token_ids == want.token_ids
            assert got.logprobs[0].logprob == pytest.approx(want.logprobs[0].logprob, abs=1e-4)
        more = SamplingParams(max_tokens=12, ignore_eos=True)
        got = [o.token_ids for o in graphed.generate(prompts, more)]
        assert got == [o.token_ids for o in eager.generate(prompts, more)]
    buckets = {key[-1] for key in graphed.runner.graphs.captured if key[0] == "prefill"}
    assert buckets == {1, 4, 16}
    assert not any(key[0] == "prefill" for key in eager.runner.graphs.captured)
