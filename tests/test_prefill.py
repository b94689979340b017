"""The prefill step (engine/prefill.py): its token buckets, and on the GPU the graphed prefill against
the eager one (logits of the first token, the K/V the decode then reads)."""

from __future__ import annotations

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.prefill import PREFILL_GRAPH_TOKENS, prefill_bucket, staged_buffers


def test_token_buckets_pad_at_most_a_quarter_past_256():
    assert [prefill_bucket(t) for t in (1, 16, 17, 48, 200, 256)] == [16, 16, 32, 64, 256, 256]
    assert [prefill_bucket(t) for t in (257, 700, 1100, PREFILL_GRAPH_TOKENS)] == [512, 768, 1280, 2048]
    assert prefill_bucket(PREFILL_GRAPH_TOKENS + 1) is None
    for t in range(257, PREFILL_GRAPH_TOKENS + 1, 37):
        assert t <= prefill_bucket(t) < 1.25 * t + 256 and prefill_bucket(t) % 256 == 0


class EagerBuckets:
    """StepGraphs' part a prefill uses, run eagerly on the CPU: rows padded to the buckets, the step
    function called as it would be captured."""

    captures = 0
    buckets = (1, 2, 4, 8)

    def __init__(self):
        self.keys: list[tuple] = []

    def rows(self, n: int) -> int:
        return next(b for b in (1, 2, 4, 8) if b >= n)

    def run(self, key, fn, n, values, pads):
        self.keys.append((*key, self.rows(n)))
        return fn(**values)


def test_the_padded_prefill_writes_what_the_plain_one_writes(tiny_target, tiny_drafter, one_thread):
    """The graphed prefill's inputs (tokens padded to the bucket with slot -1, requests padded on the
    null row, the longest-prompt bucket as the attention's span), run eagerly on the CPU against the
    unpadded prefill: the first token's log-probabilities agree, and so does every K/V row of the
    target's and the drafter's caches (the padding wrote none)."""

    def build() -> Engine:
        config = EngineConfig(model=str(tiny_target), draft_model=str(tiny_drafter), device="cpu", max_num_seqs=8)
        e = Engine(config)
        for k, v in e.runner.kv + e.runner.draft_kv:
            k.zero_(), v.zero_()
        return e

    padded, plain = build(), build()
    runner, vocab = padded.runner, padded.target_cfg.geometry.vocab_size
    runner.graphs, runner.prefill_staged = EagerBuckets(), staged_buffers(8, torch.device("cpu"))
    runner.logits_buffer = lambda rows: torch.empty(rows, vocab)
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[2]]  # 6 + 3 + 40 tokens: bucket 64, span 64, 4 requests
    params = SamplingParams(temperature=0, max_tokens=1, logprobs=3, ignore_eos=True)
    for got, want in zip(padded.generate(prompts, params), plain.generate(prompts, params), strict=True):
        assert got.token_ids == want.token_ids
        assert got.logprobs[0].logprob == pytest.approx(want.logprobs[0].logprob, abs=1e-5)
    assert runner.graphs.keys == [("prefill", 64, 64, 4)]
    for (k, v), (k0, v0) in zip(runner.kv + runner.draft_kv, plain.runner.kv + plain.runner.draft_kv, strict=True):
        assert torch.allclose(k, k0, atol=1e-5) and torch.allclose(v, v0, atol=1e-5)
        assert k.abs().sum() > 0


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
        first = SamplingParams(temperature=0, max_tokens=1, logprobs=3, ignore_eos=True)
        for got, want in zip(graphed.generate(prompts, first), eager.generate(prompts, first), strict=True):
            assert got.token_ids == want.token_ids
            assert got.logprobs[0].logprob == pytest.approx(want.logprobs[0].logprob, abs=1e-4)
        more = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
        got = [o.token_ids for o in graphed.generate(prompts, more)]
        assert got == [o.token_ids for o in eager.generate(prompts, more)]
    buckets = {key[-1] for key in graphed.runner.graphs.captured if key[0] == "prefill"}
    assert buckets == {1, 4, 16}
    assert not any(key[0] == "prefill" for key in eager.runner.graphs.captured)


def test_every_prefill_a_server_can_meet_has_a_warmed_shape():
    """prefill_shapes covers the key of every step of random prompts (lengths, count, total within the
    limits), keyed as prefill() keys it; and the spans are 16 * 4^i capped at the token bucket."""
    import random

    from engine.prefill import prefill_shapes, query_bucket, request_bucket

    buckets, limit = [1, 2, 4, 8, 16, 24, 32], 700
    shapes, rng = set(prefill_shapes(buckets, limit)), random.Random(0)
    assert all(q in (16, 64, 256, 1024, t) and q <= t for t, q, _ in shapes)
    assert {m for _, _, m in shapes} == {1, 2, 4, 8, 16, 32}  # prefill rows skip the decode-only 24
    for _ in range(3000):
        n = rng.randint(1, 32)
        lens = [rng.randint(1, rng.choice((4, 40, 400))) for _ in range(n)]
        if sum(lens) > limit:
            continue
        t = prefill_bucket(sum(lens))
        assert (t, query_bucket(max(lens), t), request_bucket(buckets, n)) in shapes, lens
    assert not any(t > prefill_bucket(limit) for t, _, _ in shapes)


def test_a_warmed_prefill_writes_no_cache_row(tiny_target, tiny_drafter, one_thread):
    """warm_prefill runs each shape on padding alone: no target or drafter K/V row changes, one graph
    per shape (CPU stand-in capture), and a frozen engine's prefill then replays instead of capturing."""
    from engine.prefill import prefill_shapes, warm_prefill
    from tests.graph_fakes import CPUGraphs

    e = Engine(EngineConfig(model=str(tiny_target), draft_model=str(tiny_drafter), device="cpu", max_num_seqs=4))
    runner = e.runner
    runner.graphs, runner.prefill_staged = CPUGraphs([1, 2, 4]), staged_buffers(4, torch.device("cpu"))
    vocab = e.target_cfg.geometry.vocab_size
    runner.logits_buffer = lambda rows: torch.empty(rows, vocab)
    tensors = lambda: [t for kv in runner.kv + runner.draft_kv for t in kv]  # noqa: E731
    caches = [t.clone() for t in tensors()]
    shapes = prefill_shapes(runner.graphs.buckets, 64)
    warm_prefill(runner, shapes)
    assert runner.graphs.captures == len(shapes)
    assert all(torch.equal(a, b) for a, b in zip(caches, tensors(), strict=True))
    runner.graphs.frozen = True
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    e.generate([PROMPTS[0], PROMPTS[1]], params)
    assert runner.graphs.eager_misses == 0 and runner.graphs.captures == len(shapes)
