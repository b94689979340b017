"""Failure isolation: a fault finishes exactly the requests it belongs to, as `error`, frees their KV
and slots, and the engine keeps serving; a fault no request can be blamed for ends every running
request and resets the engine; nothing spins."""

from __future__ import annotations

import pytest
import torch

import engine.sampler as sampler
from engine import Engine, EngineConfig, SamplingParams
from tests.engine_checks import assert_idle

PROMPTS = [[5, 6, 7, 8, 9, 10], [1, 2, 3], list(range(20, 40)), [7] * 9]
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
POISON = 13  # the seed of the request whose sampling distribution the patched sampler spoils


def _engine(target, drafter=None, **kw) -> Engine:
    draft = None if drafter is None else str(drafter)
    return Engine(EngineConfig(model=str(target), draft_model=draft, device="cpu", kv_block_size=4, **kw))


def _sampled(seed: int) -> SamplingParams:
    return SamplingParams(max_tokens=12, temperature=0.8, seed=seed, ignore_eos=True)


@pytest.fixture
def poisoned(monkeypatch):
    """Sampling rows of the POISON-seeded request come out NaN (as a NaN temperature would)."""
    real = sampler.filtered_probs

    def probs(logits, params):
        p = real(logits, params)
        return torch.full_like(p, float("nan")) if params.seed == POISON else p

    monkeypatch.setattr(sampler, "filtered_probs", probs)


@pytest.mark.parametrize("drafter", [False, True], ids=["plain", "spec"])
def test_a_sampling_fault_fails_only_its_request(tiny_target, tiny_drafter, poisoned, one_thread, drafter):
    engine = _engine(tiny_target, tiny_drafter if drafter else None)
    params = [GREEDY, _sampled(1), _sampled(POISON), GREEDY]
    outs = engine.generate(PROMPTS, params)
    bad = outs[2]
    assert bad.finished and bad.finish_reason == "error" and "NaN" in bad.error
    ref = _engine(tiny_target, tiny_drafter if drafter else None).generate(
        PROMPTS[:2] + PROMPTS[3:], params[:2] + params[3:]
    )  # the same engine without the faulty request: seeded draws included
    assert [o.token_ids for o in outs[:2] + outs[3:]] == [o.token_ids for o in ref]
    assert all(o.finish_reason == "length" for o in outs[:2] + outs[3:])
    assert_idle(engine)


@pytest.mark.parametrize("drafter", [False, True], ids=["plain", "spec"])
def test_a_sampling_fault_mid_decode_keeps_its_tokens_and_frees_its_kv(
    tiny_target, tiny_drafter, monkeypatch, one_thread, drafter
):
    engine = _engine(tiny_target, tiny_drafter if drafter else None, max_num_seqs=2)
    real, calls = sampler.filtered_probs, {"n": 0}

    def probs(logits, params):  # the sampled request's 5th draw fails (a decode step, not the prefill)
        calls["n"] += 1
        return torch.full_like(logits, float("nan")) if calls["n"] == 5 else real(logits, params)

    monkeypatch.setattr(sampler, "filtered_probs", probs)
    outs = engine.generate(PROMPTS[:3], [GREEDY, _sampled(3), GREEDY])
    assert outs[1].finish_reason == "error" and 0 < len(outs[1].token_ids) < 12  # failed after its prefill
    if not drafter:
        assert len(outs[1].token_ids) == 4  # prefill + 3 decode draws committed, the 4th failed
    else:
        assert engine.stats.rounds > 0
    ref = _engine(tiny_target).generate([PROMPTS[0], PROMPTS[2]], GREEDY)
    assert [outs[0].token_ids, outs[2].token_ids] == [o.token_ids for o in ref]
    assert_idle(engine)


@pytest.mark.parametrize("where", ["verify", "prefill"])
def test_an_unattributed_fault_fails_the_running_requests_and_the_engine_recovers(
    tiny_target, tiny_drafter, monkeypatch, one_thread, where
):
    engine = _engine(tiny_target, tiny_drafter, max_num_seqs=2)
    real = getattr(engine.runner, where)
    calls = {"n": 0}

    def once(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("injected device fault")
        return real(*args, **kwargs)

    monkeypatch.setattr(engine.runner, where, once)
    for p in PROMPTS:
        engine.add_request(p, GREEDY)
    final = {}
    while engine.has_unfinished():
        for out in engine.step():
            assert out.request_id not in final, "a request was answered twice"
            if out.finished:
                final[out.request_id] = out
    assert len(final) == len(PROMPTS)
    failed = [o for o in final.values() if o.finish_reason == "error"]
    assert failed and all("injected device fault" in o.error for o in failed)
    assert len(failed) <= 2  # the running ones (max_num_seqs=2); waiting requests are served after
    assert_idle(engine)
    fresh = _engine(tiny_target, tiny_drafter).generate(PROMPTS, GREEDY)
    done = [o for o in final.values() if o.finish_reason == "length"]
    by_prompt = {tuple(o.prompt_token_ids): o.token_ids for o in fresh}
    assert all(o.token_ids == by_prompt[tuple(o.prompt_token_ids)] for o in done)
    later = engine.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in later] == [o.token_ids for o in fresh]
    assert_idle(engine)


def test_a_step_that_cannot_run_raises_instead_of_spinning(tiny_target, monkeypatch):
    engine = _engine(tiny_target)
    monkeypatch.setattr(engine.scheduler, "schedule", lambda admit=True: None)  # a broken invariant: work, no step
    engine.add_request(PROMPTS[0], GREEDY)
    with pytest.raises(RuntimeError, match="no step can run"):
        engine.step()
    with pytest.raises(RuntimeError, match="no step can run"):
        engine.generate(PROMPTS[1], GREEDY)
