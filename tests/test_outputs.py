"""vLLM-shaped results and prompts beside today's fields, checked against vLLM's documented shapes:
RequestOutput(request_id, prompt, prompt_token_ids, outputs, finished), CompletionOutput(index, text,
token_ids, cumulative_logprob, logprobs, finish_reason, stop_reason), Logprob(logprob, rank,
decoded_token); TextPrompt / TokensPrompt dicts; LLM.chat(messages, sampling_params)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.outputs import CompletionOutput, Logprob, RequestOutput

PROMPT = "def main():\n"
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(shipped_tiny, one_thread):
    return Engine(EngineConfig(model=str(shipped_tiny[0]), draft_model=str(shipped_tiny[1]), device="cpu"))


def _fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_the_shapes_carry_vllms_fields():
    vllm = {"request_id", "prompt", "prompt_token_ids", "prompt_logprobs", "outputs", "finished", "num_cached_tokens"}
    assert vllm <= _fields(RequestOutput)
    vllm = {"index", "text", "token_ids", "cumulative_logprob", "logprobs", "finish_reason", "stop_reason"}
    assert vllm <= _fields(CompletionOutput)
    assert _fields(Logprob) == {"logprob", "rank", "decoded_token"}


def test_one_completion_mirrors_the_flat_fields(engine):
    (out,) = engine.generate(PROMPT, GREEDY)
    (c,) = out.outputs
    assert out.prompt == PROMPT and out.prompt_token_ids == engine.tokenizer.encode(PROMPT, add_special_tokens=False)
    assert (c.index, c.text, c.token_ids, c.finish_reason) == (0, out.text, out.token_ids, "length")
    assert c.finished() and c.text and len(c.token_ids) == 8
    assert c.logprobs is None and c.cumulative_logprob is None and c.stop_reason is None  # not asked for


def test_logprobs_per_position_hold_the_chosen_token_and_the_top_k(engine):
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=10, ignore_eos=True, logprobs=3)
    (out,) = engine.generate(PROMPT, params)
    c = out.outputs[0]
    assert len(c.logprobs) == len(c.token_ids) == 10
    for token, position, flat in zip(c.token_ids, c.logprobs, out.logprobs, strict=True):
        chosen = position[token]
        assert chosen.logprob == flat.logprob <= 0 and chosen.rank >= 1
        assert chosen.decoded_token == engine.tokenizer.decode([token])
        ranks = sorted(e.rank for e in position.values())  # the top 3, and the chosen one where it is not among them
        assert ranks == ([1, 2, 3] if chosen.rank <= 3 else [1, 2, 3, chosen.rank])
    chosen = [p[t].logprob for t, p in zip(c.token_ids, c.logprobs, strict=True)]
    assert c.cumulative_logprob == pytest.approx(sum(chosen))
    # the first token's rank, against the target's own distribution after the prompt
    lp = torch.log_softmax(engine.last_logits(out.prompt_token_ids), dim=-1)
    assert c.logprobs[0][c.token_ids[0]].rank == 1 + int((lp > lp[c.token_ids[0]]).sum())
    greedy = engine.generate(PROMPT, dataclasses.replace(GREEDY, logprobs=0))[0].outputs[0]
    assert all(p[t].rank == 1 and len(p) == 1 for t, p in zip(greedy.token_ids, greedy.logprobs, strict=True))


def test_stop_reason_names_the_stop_string_or_token(engine):
    free = engine.generate(PROMPT, dataclasses.replace(GREEDY, max_tokens=24)).pop()
    stop = free.text[6:9]
    by_string = engine.generate(PROMPT, dataclasses.replace(GREEDY, max_tokens=24, stop=[stop, "@@"]))[0]
    assert by_string.outputs[0].stop_reason == stop and by_string.outputs[0].finish_reason == "stop"
    token = free.token_ids[5]
    by_token = engine.generate(PROMPT, dataclasses.replace(GREEDY, max_tokens=24, stop_token_ids=[token]))[0]
    assert by_token.outputs[0].stop_reason == token and by_token.outputs[0].token_ids[-1] == token


def test_text_and_tokens_prompts_as_vllms_dicts(engine):
    ids = engine.tokenizer.encode(PROMPT, add_special_tokens=False)
    as_text, as_dict, as_ids, as_tokens = engine.generate(
        [PROMPT, {"prompt": PROMPT}, ids, {"prompt_token_ids": ids}], GREEDY
    )
    assert as_text.token_ids == as_dict.token_ids == as_ids.token_ids == as_tokens.token_ids
    assert (as_dict.prompt, as_ids.prompt, as_tokens.prompt) == (PROMPT, None, None)
    (single,) = engine.generate({"prompt_token_ids": ids}, GREEDY)  # one dict is one prompt
    assert single.token_ids == as_ids.token_ids and single.prompt_token_ids == ids
    (bad,) = engine.generate({"prompt": PROMPT, "multi_modal_data": {}}, GREEDY)
    assert bad.finish_reason == "rejected" and "'multi_modal_data'" in bad.error


def test_chat_renders_through_the_tokenizers_template(engine):
    messages = [{"role": "system", "content": "Write Python."}, {"role": "user", "content": "parse args"}]
    rendered = engine.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == "# system: Write Python.\n# user: parse args\n# assistant:\n"
    (chat,) = engine.chat(messages, GREEDY)
    assert chat.prompt == rendered and chat.token_ids == engine.generate(rendered, GREEDY)[0].token_ids
    two = engine.chat([messages, messages[1:]], {"temperature": 0, "max_tokens": 8, "ignore_eos": True})
    assert two[0].token_ids == chat.token_ids and two[1].prompt == "# user: parse args\n# assistant:\n"


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ([], "non-empty list"),
        ("hi", "non-empty list"),
        ([{"role": "user"}], "exactly 'role' and 'content'"),
        ([{"role": "tool", "content": "x"}], "role must be one of"),
        ([{"role": "user", "content": 3}], "content a string"),
        ([[{"role": "user", "content": "x"}], []], "conversation 1 must be a non-empty list"),
    ],
)
def test_bad_conversations_are_refused(engine, messages, message):
    with pytest.raises(ValueError, match=message):
        engine.chat(messages)


def test_chat_without_a_tokenizer_is_refused(tiny_target):
    engine = Engine(EngineConfig(model=str(tiny_target), device="cpu"))
    with pytest.raises(ValueError, match="chat needs a tokenizer"):
        engine.chat([{"role": "user", "content": "x"}])


def test_n_completions_each_carry_their_own_shape(engine):
    params = SamplingParams(n=3, temperature=1.0, seed=9, max_tokens=6, ignore_eos=True, logprobs=1)
    (out,) = engine.generate({"prompt": PROMPT}, params)
    assert out.finished and out.prompt == PROMPT and (out.prompt_logprobs, out.num_cached_tokens) == (None, 0)
    assert [c.index for c in out.outputs] == [0, 1, 2] and len({tuple(c.token_ids) for c in out.outputs}) > 1
    for c in out.outputs:
        assert (
            c.text == engine.tokenizer.decode(c.token_ids, skip_special_tokens=True)
            and c.finish_reason == "length"
            and c.finished()
        )
        chosen = [p[t].logprob for t, p in zip(c.token_ids, c.logprobs, strict=True)]
        assert len(chosen) == 6 and c.cumulative_logprob == pytest.approx(sum(chosen))
    first = out.outputs[0]
    assert (out.token_ids, out.text, out.finish_reason) == (first.token_ids, first.text, first.finish_reason)
    rid = engine.add_request({"prompt": PROMPT}, params)  # add_request runs n too, as one request
    while engine.has_unfinished():
        stepped = [o for o in engine.step() if o.request_id == rid]
    assert [(c.index, c.token_ids, c.text) for c in stepped[0].outputs] == [
        (c.index, c.token_ids, c.text) for c in out.outputs
    ]


@pytest.mark.parametrize(
    ("prompt", "named"),
    [
        ({"prompt": PROMPT, "multi_modal_data": {}}, "'multi_modal_data'"),
        ({"prompt_token_ids": [1, 2], "prompt_embeds": None}, "'prompt_embeds'"),
        ({"prompt": 5}, "prompt 1['prompt'] must be a string"),
        ({"prompt_token_ids": "12"}, "prompt 1['prompt_token_ids'] must be token ids"),
        ({"prompt_token_ids": [3, 2.5]}, "item 1 is 2.5"),
        ({}, "exactly one of 'prompt' and 'prompt_token_ids'"),
        ({"prompt": PROMPT, "prompt_token_ids": [1]}, "exactly one of 'prompt' and 'prompt_token_ids'"),
    ],
)
def test_a_malformed_dict_prompt_is_refused_alone_naming_the_key(engine, prompt, named):
    good, bad = engine.generate([PROMPT, prompt], GREEDY)
    assert good.finish_reason == "length" and len(good.token_ids) == 8
    assert bad.finish_reason == "rejected" and bad.outputs[0].finish_reason == "rejected" and named in bad.error
    rid = engine.add_request(prompt, GREEDY)  # the same answer one request at a time
    (out,) = [o for o in engine.step() if o.request_id == rid]
    assert out.finish_reason == "rejected" and out.error


def test_chat_with_a_tokenizer_without_a_template_is_refused(engine, monkeypatch):
    monkeypatch.setattr(engine.tokenizer, "chat_template", None)
    with pytest.raises(ValueError, match="no chat template"):
        engine.chat([{"role": "user", "content": "x"}], GREEDY)
    assert not engine.has_unfinished()  # refused before anything was admitted
