"""vLLM's penalties and min_p, lossless under speculation: every verify row is penalized with the
drafts before it counted, so speculative output equals plain output token for token (greedy) and
each committed token is drawn from plain decode's own distribution (sampled, seeded). Also n,
skip_special_tokens and include_stop_str_in_output."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import engine.round as round_module
from engine import Engine, EngineConfig, SamplingParams
from engine import sampler as sampler_module
from engine.request import Finish, Request
from engine.sampler import filtered_probs, penalized_logits

PROMPTS = ["def main():\n", "import os\n", "class Config:\n", "# Copyright"]
PENALTIES = dict(presence_penalty=0.6, frequency_penalty=0.4, repetition_penalty=1.3)
GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, **PENALTIES)


@pytest.fixture(scope="module")
def pair(shipped_tiny, one_thread):
    target, drafter = shipped_tiny
    spec = Engine(EngineConfig(model=str(target), draft_model=str(drafter), device="cpu", max_num_seqs=4))
    plain = Engine(EngineConfig(model=str(target), device="cpu", max_num_seqs=4))
    return spec, plain


def test_penalties_follow_vllms_formulas():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, -2.0], [2.0, -1.0, 0.5, 3.0, -2.0]])
    p = SamplingParams(presence_penalty=0.3, frequency_penalty=0.5, repetition_penalty=2.0)
    out = penalized_logits(logits, [([0, 4], [2, 2, 3]), ([], [])], [p, SamplingParams(presence_penalty=1.0)])
    # repetition on prompt or output tokens (0, 2, 3, 4): positive / 2, negative x 2; then the output's
    # counts (2: twice, 3: once) x 0.5 and presence 0.3 subtracted
    assert out[0].tolist() == pytest.approx([1.0, -1.0, 0.25 - 1.0 - 0.3, 1.5 - 0.5 - 0.3, -4.0])
    assert out[1].tolist() == logits[1].tolist()  # an empty output: nothing to penalize
    assert logits[0, 0] == 2.0  # pure: the input is not changed


def test_min_p_keeps_tokens_near_the_most_likely():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    kept = filtered_probs(logits, SamplingParams(min_p=0.5)) > 0
    assert kept.tolist() == [True, True, False, False]  # 0.3 >= 0.5 x 0.5; 0.15 is not
    assert (filtered_probs(logits, SamplingParams(min_p=1.0)) > 0).tolist() == [True, False, False, False]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("presence_penalty", 2.5, r"presence_penalty must be in \[-2, 2\]"),
        ("frequency_penalty", "1", "frequency_penalty=.*expected a finite number"),
        ("repetition_penalty", 0, "repetition_penalty must be > 0"),
        ("min_p", 1.5, r"min_p must be in \[0, 1\]"),
        ("n", 0, "n=0; expected an int in"),
        ("skip_special_tokens", 1, "skip_special_tokens=1; expected a bool"),
        ("include_stop_str_in_output", "yes", "include_stop_str_in_output"),
    ],
)
def test_bad_values_are_refused(field, value, message):
    with pytest.raises(ValueError, match=f"SamplingParams.{message}"):
        SamplingParams(**{field: value})


def test_a_penalized_request_is_not_greedy_on_the_device():
    assert SamplingParams(temperature=0).greedy and not SamplingParams(temperature=0, presence_penalty=0.1).greedy
    assert not SamplingParams(repetition_penalty=1.0).penalized


@pytest.mark.parametrize("levers", [{}, {"max_drafts": 2}, {"max_batch": 2}, {"max_batch": 0, "max_drafts": 0}])
def test_greedy_penalized_speculation_equals_plain_decode(pair, levers):
    spec, plain = pair
    spec.set_levers(**({"max_batch": 0, "max_drafts": 0} | levers))
    before = spec.stats.rounds
    a, b = spec.generate(PROMPTS, GREEDY), plain.generate(PROMPTS, GREEDY)
    assert [x.token_ids for x in a] == [y.token_ids for y in b]
    free = plain.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    assert all(x.token_ids != f.token_ids for x, f in zip(b, free, strict=True))  # the penalties bite
    if not levers.get("max_batch"):
        assert spec.stats.rounds > before


def test_rows_that_did_not_count_their_drafts_would_differ(pair, monkeypatch):
    """The test above can fail: verify rows penalized on the committed output alone diverge."""
    spec, plain = pair
    spec.set_levers(max_batch=0, max_drafts=0)
    real = round_module.sample_requests
    monkeypatch.setattr(
        round_module, "sample_requests", lambda lg, gr, reqs, rows, drafts=None: real(lg, gr, reqs, rows)
    )
    a, b = spec.generate(PROMPTS, GREEDY), plain.generate(PROMPTS, GREEDY)
    assert [x.token_ids for x in a] != [y.token_ids for y in b]


def test_sampled_penalized_tokens_come_from_plain_decodes_distribution(pair, monkeypatch):
    """Each committed token of a seeded speculative run is drawn from exactly the distribution plain
    decode has after the same prefix (penalties, temperature, min_p): lossless in distribution."""
    spec, plain = pair
    spec.set_levers(max_batch=0, max_drafts=0)
    drawn: dict[tuple[int, ...], torch.Tensor] = {}
    real = sampler_module.sample_rows

    def recording(logits, greedy_tokens, row_params, row_generators, row_priors=None):
        for i, p in enumerate(row_params):
            x = penalized_logits(logits[i : i + 1], [row_priors[i]], [p])[0]
            drawn[tuple(row_priors[i][1])] = filtered_probs(x, p)
        return real(logits, greedy_tokens, row_params, row_generators, row_priors)

    monkeypatch.setattr(sampler_module, "sample_rows", recording)
    params = SamplingParams(temperature=0.3, min_p=0.05, seed=11, max_tokens=32, ignore_eos=True, **PENALTIES)
    rounds, committed = spec.stats.rounds, spec.stats.committed_tokens
    (out,) = spec.generate(PROMPTS[0], params)
    assert spec.stats.committed_tokens - committed > spec.stats.rounds - rounds  # some rounds accepted drafts
    ids = out.prompt_token_ids
    for j, token in enumerate(out.token_ids):
        prior = out.token_ids[:j]
        expected = filtered_probs(
            penalized_logits(plain.last_logits(ids + prior)[None], [(ids, prior)], [params])[0], params
        )
        assert torch.allclose(drawn[tuple(prior)], expected, atol=1e-4), j
        assert expected[token] > 0


def test_n_completions_of_one_prompt(pair):
    spec, _ = pair
    spec.set_levers(max_batch=0, max_drafts=0)
    params = SamplingParams(n=3, seed=5, max_tokens=6, ignore_eos=True)
    (out,) = spec.generate(PROMPTS[1], params)
    assert [c.index for c in out.outputs] == [0, 1, 2] and len({tuple(c.token_ids) for c in out.outputs}) > 1
    alone = [spec.generate(PROMPTS[1], dataclasses.replace(params, n=1, seed=5 + c))[0] for c in range(3)]
    assert [c.token_ids for c in out.outputs] == [a.token_ids for a in alone]
    assert out.token_ids == out.outputs[0].token_ids and out.finished
    two = spec.generate(PROMPTS[:2], [dataclasses.replace(params, n=2), SamplingParams(max_tokens=2)])
    assert [len(o.outputs) for o in two] == [2, 1]
    rid = spec.add_request(PROMPTS[1], params)  # add_request runs n too, reported as one request
    while spec.has_unfinished():
        stepped = [o for o in spec.step() if o.request_id == rid]
    assert [c.token_ids for c in stepped[0].outputs] == [c.token_ids for c in out.outputs]


def test_stop_strings_kept_in_the_text_when_asked(pair):
    _, plain = pair
    free = plain.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))[0]
    stop = free.text[10:13]
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True, stop=[stop])
    cut, kept = plain.generate([PROMPTS[0]] * 2, [params, dataclasses.replace(params, include_stop_str_in_output=True)])
    at = free.text.find(stop)
    assert (cut.text, kept.text) == (free.text[:at], free.text[: at + len(stop)]) and cut.token_ids == kept.token_ids


def test_special_tokens_in_the_text_when_asked(pair):
    tokenizer = pair[1].tokenizer
    ids = tokenizer.encode("x = 1", add_special_tokens=False) + [tokenizer.eos_token_id]
    texts = []
    for skip in (True, False):
        req = Request(0, [5], SamplingParams(skip_special_tokens=skip), frozenset())
        req.output_ids = list(ids)
        req.finish(Finish.STOP)
        texts.append(req.output(tokenizer).outputs[0].text)
    assert texts == ["x = 1", "x = 1" + tokenizer.eos_token]
