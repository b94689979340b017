"""The triton backend and CUDA graphs against the torch path (GPU only; skipped on CPU)."""

from __future__ import annotations

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

PROMPTS = [[5, 6, 7, 8, 9, 10], [1, 2, 3], list(range(20, 60)), [7] * 9, [100, 200, 150, 42, 42, 8, 1]]


def prompts(n: int) -> list[list[int]]:
    return [PROMPTS[i % len(PROMPTS)] + [i % 250] for i in range(n)]


def engine(target, drafter=None, **kw) -> Engine:
    return Engine(EngineConfig(model=str(target), draft_model=drafter and str(drafter), device="cuda", **kw))


@pytest.fixture(scope="module")
def reference(tiny_target):
    torch_engine = engine(tiny_target, backend="torch", dtype="float32")
    return {
        n: [
            o.token_ids
            for o in torch_engine.generate(prompts(n), SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
        ]
        for n in (1, 3, 9, 17)
    }


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_triton_greedy_equals_torch_fp32(tiny_target, reference, graphs):
    e = engine(tiny_target, backend="triton", dtype="float32", cuda_graphs=graphs, max_num_seqs=17)
    for n, want in reference.items():  # batch sizes crossing the 1/2/4/8/16 bucket boundaries
        got = [
            o.token_ids for o in e.generate(prompts(n), SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
        ]
        assert got == want, f"batch of {n}"
    if graphs:
        assert e.runner.graphs.captured, "no CUDA graph was captured"


@pytest.mark.parametrize("levers", [{}, {"max_drafts": 2}, {"max_batch": 2}], ids=["full", "trim2", "gate2"])
def test_speculative_with_graphs_is_lossless_fp32(tiny_target, tiny_drafter, reference, levers):
    e = engine(tiny_target, tiny_drafter, backend="triton", dtype="float32", max_num_seqs=17, levers=levers)
    for n, want in reference.items():
        got = [
            o.token_ids for o in e.generate(prompts(n), SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
        ]
        assert got == want, f"batch of {n}"
    assert any(key[0] == "verify" for key in e.runner.graphs.captured), "no verify graph was captured"


def test_short_span_graph_never_serves_a_long_span(tiny_target, tiny_drafter):
    e = engine(tiny_target, tiny_drafter, backend="triton", dtype="float32")
    plain = engine(tiny_target, backend="triton", dtype="float32")
    for budget in (2, 3, 24):  # one-token and two-token spans are captured before the full span
        got = e.generate([PROMPTS[2]], SamplingParams(temperature=0, max_tokens=budget, ignore_eos=True))[0].token_ids
        want = plain.generate([PROMPTS[2]], SamplingParams(temperature=0, max_tokens=budget, ignore_eos=True))[
            0
        ].token_ids
        assert got == want
    verify = {key: graph for key, graph in e.runner.graphs.captured.items() if key[0] == "verify"}
    assert {key[1] for key in verify} == {e.drafts_per_round}  # budgets cut acceptance, not the span
    for (_, k, _, bucket), graph in verify.items():  # (kind, drafts, accept rule, bucket)
        assert graph.inputs["drafts"].shape == (bucket, k)  # captured rows and span == replayed ones


@pytest.mark.parametrize("max_batch", [0, 3], ids=["speculating", "gated-then-speculating"])
def test_graphed_steps_store_the_drafter_context_fp32(tiny_target, tiny_drafter, max_batch):
    from transformers import Qwen3ForCausalLM as HFQwen3

    from tests.kv_checks import check_draft_kv

    e = engine(tiny_target, tiny_drafter, backend="triton", dtype="float32", levers={"max_batch": max_batch})
    hf = HFQwen3.from_pretrained(str(tiny_target), dtype=torch.float32).eval()
    for p, budget in zip(PROMPTS, (24, 9, 17, 13, 21), strict=True):
        e.add_request(p, SamplingParams(temperature=0, max_tokens=budget, ignore_eos=True))
    checked = 0
    while e.has_unfinished():
        e.step()
        checked += check_draft_kv(e, hf, atol=1e-3)
    assert checked > 10 and e.runner.graphs.captured


def _row_logits(e: Engine, reqs, ids) -> torch.Tensor:
    """A copy: a span step's logits are a view of the runner's one buffer, which the next step rewrites."""
    res = e.runner.span_rows(torch.tensor(ids, device="cuda"), [r.slot for r in reqs], [r.num_kv for r in reqs])
    return res.logits.clone()


def test_graphs_share_one_logits_buffer(tiny_target, tiny_drafter):
    """Every span graph writes its logits and features into the runner's one buffer each, so a graph
    costs its intermediates' pool memory only, not its own [rows, V] logits."""
    e = engine(tiny_target, tiny_drafter, backend="triton", dtype="float32", max_num_seqs=17)
    e.generate(prompts(9), SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    e.generate(prompts(17), SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    steps = {key: g for key, g in e.runner.graphs.captured.items() if key[0] in ("verify", "decode")}
    assert len({key[-1] for key in steps}) >= 2  # two batch buckets at least
    steps = list(steps.values())
    logits, features = e.runner._span_out
    for g in steps:
        assert g.outputs[0].data_ptr() == logits.data_ptr()
        assert g.outputs[2].data_ptr() == features.data_ptr()


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_batch_invariant_rows_are_bit_identical(tiny_target, graphs):
    e = engine(tiny_target, backend="triton", dtype="bfloat16", batch_invariant=True, cuda_graphs=graphs)
    for p in prompts(7):
        e.add_request(p, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    e.step()  # prefill all seven
    reqs = list(e.scheduler.running)
    first = reqs[0]
    alone = _row_logits(e, [first], [[first.current_token]])[0]
    batch = _row_logits(e, reqs, [[r.current_token] for r in reqs])[0]
    span = _row_logits(e, [first], [[first.current_token, 11, 12, 13]])[0]
    assert torch.equal(alone, batch)
    assert torch.equal(alone, span)


def test_bf16_speculative_matches_plain_up_to_the_oracle(tiny_target, tiny_drafter):
    from gates.lossless import Tally, check

    plain = engine(tiny_target, backend="triton")
    spec = engine(tiny_target, tiny_drafter, backend="triton", levers={"max_batch": 3})
    params = [SamplingParams(temperature=0, max_tokens=b, ignore_eos=True) for b in (24, 9, 17, 13, 21)]
    outs = spec.generate(PROMPTS, params)
    tally = Tally()
    for prompt, p, got in zip(PROMPTS, params, outs, strict=True):
        (want,) = plain.generate([prompt], p)
        check(plain, prompt, want.token_ids, got.token_ids, tally, exact=False, max_tokens=p.max_tokens)
    assert tally.compared_tokens == sum(p.max_tokens for p in params)
