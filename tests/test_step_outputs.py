"""Engine.step() as vLLM's LLMEngine.step (output_kind CUMULATIVE, its default): every RequestOutput a
step returns carries the request's text and token ids so far, in the flat fields and in
`outputs[i]` (CompletionOutput index, text, token_ids, finish_reason) alike, the running text decoded
incrementally; add_request(prompt, SamplingParams(n=k)) reports one RequestOutput with k completions."""

from __future__ import annotations

import dataclasses

import pytest

from engine import Engine, EngineConfig, SamplingParams

PROMPT = "def main():\n"
GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(shipped_tiny, one_thread):
    return Engine(EngineConfig(model=str(shipped_tiny[0]), draft_model=str(shipped_tiny[1]), device="cpu"))


def _run(engine: Engine, prompt, params: SamplingParams) -> tuple[str, list]:
    """add_request, then step() until the request's outputs are all in; its id and outputs in order."""
    rid = engine.add_request(prompt, params)
    outs = []
    while engine.has_unfinished():
        outs += [o for o in engine.step() if o.request_id == rid]
    return rid, outs


@pytest.mark.parametrize("stop", [(), ("@@never@@",)])
def test_each_step_carries_the_text_so_far(engine, stop):
    params = dataclasses.replace(GREEDY, stop=stop)
    _, outs = _run(engine, PROMPT, params)
    (final,) = engine.generate(PROMPT, params)
    assert outs[-1].finished and outs[-1].text == final.text and outs[-1].token_ids == final.token_ids
    assert len(outs) > 3 and not any(o.finished for o in outs[:-1])
    hold = max(map(len, stop), default=1) - 1  # the characters a stop string could still take back
    seen = ""
    for out in outs:
        (c,) = out.outputs
        assert (c.index, c.text, c.token_ids, c.finish_reason) == (0, out.text, out.token_ids, out.finish_reason)
        assert final.token_ids[: len(out.token_ids)] == out.token_ids
        if not out.finished:
            whole = engine.tokenizer.decode(out.token_ids, skip_special_tokens=True).rstrip("\ufffd")
            assert out.text == whole[: max(0, len(whole) - hold)] and out.finish_reason is None
        assert out.text.startswith(seen) and final.text.startswith(out.text)
        seen = out.text
    assert outs[-2].text  # the text arrives while the request runs, not only at its end


def test_a_stop_string_never_shows_in_the_running_text(engine):
    (free,) = engine.generate(PROMPT, GREEDY)
    stop = free.text[12:15]
    _, outs = _run(engine, PROMPT, dataclasses.replace(GREEDY, stop=[stop]))
    assert outs[-1].finish_reason == "stop" and outs[-1].text == free.text[: free.text.find(stop)]
    assert all(stop not in o.text and outs[-1].text.startswith(o.text) for o in outs)


def test_the_running_text_is_decoded_incrementally(engine, monkeypatch):
    decode, lengths = engine.tokenizer.decode, []

    def counting(ids, **kwargs):
        lengths.append(len(ids))
        return decode(ids, **kwargs)

    monkeypatch.setattr(engine.tokenizer, "decode", counting)
    for stop in ((), ("@@never@@",)):
        lengths.clear()
        _, outs = _run(engine, PROMPT, dataclasses.replace(GREEDY, max_tokens=200, stop=stop))
        assert len(outs[-1].token_ids) == 200 and len(outs) > 20
        assert lengths.count(200) == 1 and sorted(lengths)[-2] < 32  # the whole output once: at its end


def test_n_completions_through_add_request(engine):
    params = SamplingParams(n=3, temperature=1.0, seed=9, max_tokens=8, ignore_eos=True, logprobs=1)
    rid, outs = _run(engine, PROMPT, params)
    (alone,) = engine.generate(PROMPT, params)
    assert all(o.request_id == rid and [c.index for c in o.outputs] == [0, 1, 2] for o in outs)
    assert [o.finished for o in outs] == [False] * (len(outs) - 1) + [True]
    last = outs[-1]
    assert [c.token_ids for c in last.outputs] == [c.token_ids for c in alone.outputs]
    assert [c.text for c in last.outputs] == [c.text for c in alone.outputs]
    assert len({tuple(c.token_ids) for c in last.outputs}) > 1 and all(c.finished() for c in last.outputs)
    assert (last.token_ids, last.text, last.prompt) == (last.outputs[0].token_ids, last.outputs[0].text, PROMPT)
    for c in last.outputs:
        assert len(c.logprobs) == 8 and c.cumulative_logprob == pytest.approx(
            sum(p[t].logprob for t, p in zip(c.token_ids, c.logprobs, strict=True))
        )


def test_n_completions_abort_together(engine):
    rid = engine.add_request(PROMPT, SamplingParams(n=2, max_tokens=30, seed=1, ignore_eos=True))
    (first,) = [o for o in engine.step() if o.request_id == rid]
    assert len(first.outputs) == 2 and not first.finished
    engine.abort(rid)
    (last,) = [o for o in engine.step() if o.request_id == rid]
    assert last.finished and [c.finish_reason for c in last.outputs] == ["abort", "abort"]
    assert not engine.has_unfinished() and engine.scheduler.blocks.num_free == engine.scheduler.blocks.capacity


def test_a_rejected_prompt_rejects_each_of_its_completions(engine):
    rid = engine.add_request({"prompt_token_ids": []}, SamplingParams(n=2))
    (out,) = [o for o in engine.step() if o.request_id == rid]
    assert out.finished and [c.finish_reason for c in out.outputs] == ["rejected", "rejected"]
    assert out.error == "empty prompt"
