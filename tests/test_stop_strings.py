"""Stop strings, min_tokens, logprobs and generate's progress bar, with speculation on and off."""

from __future__ import annotations

import random

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.shipped import shipped_pair
from engine.stopping import Detokenizer, StopStrings

PROMPTS = ["def main():\n", "import os\n", "class Config:\n", "# Copyright"]
FREE = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)


@pytest.fixture(scope="module")
def pair(one_thread):
    target, drafter = shipped_pair("tiny")
    spec = Engine(EngineConfig(model=str(target), draft_model=str(drafter), device="cpu", max_num_seqs=4))
    plain = Engine(EngineConfig(model=str(target), device="cpu", max_num_seqs=4))
    return spec, plain


@pytest.fixture(scope="module")
def free_runs(pair):
    return pair[1].generate(PROMPTS, FREE)


def test_stop_string_scan_reports_each_occurrence_once_at_its_last_token():
    pieces = {1: "ab", 2: "c\n", 3: "d", 4: "\n", 5: "x"}
    stops = StopStrings(["\n"], lambda ids: "".join(pieces[i] for i in ids))
    assert [stops.find([1, 2, 3, 4, 5][:n]) for n in range(1, 6)] == [None, 3, None, 5, None]
    multi = StopStrings(["cd", "d\nx"], lambda ids: "".join(pieces[i] for i in ids))
    assert [multi.find([1, 2, 3, 4, 5][:n]) for n in range(1, 6)] == [None, None, None, None, 4]
    with pytest.raises(ValueError, match="non-empty"):
        StopStrings([""], str)


def _stops_inside(text: str) -> tuple[str, ...]:
    """Three-character pieces of the free run's text, taken from its middle and its second half."""
    return (text[len(text) // 2 : len(text) // 2 + 3], text[-8:-5])


def test_stop_strings_end_spec_and_plain_at_the_same_token(pair, free_runs):
    spec, plain = pair
    params = [
        SamplingParams(temperature=0, max_tokens=48, ignore_eos=True, stop=_stops_inside(f.text)) for f in free_runs
    ]
    before = spec.stats.committed_tokens
    with_spec, without = spec.generate(PROMPTS, params), plain.generate(PROMPTS, params)
    assert spec.stats.committed_tokens > before and spec.stats.tokens_per_round > 1  # rounds commit runs
    for free, p, a, b in zip(free_runs, params, with_spec, without, strict=True):
        assert a.token_ids == b.token_ids and a.text == b.text and a.finish_reason == b.finish_reason == "stop"
        cut = min(i for i in (free.text.find(s) for s in p.stop) if i >= 0)
        assert a.text == free.text[:cut]  # trimmed before the stop string
        assert a.token_ids == free.token_ids[: len(a.token_ids)] and len(a.token_ids) < len(free.token_ids)


def test_min_tokens_ignores_earlier_stops(pair, free_runs):
    spec, plain = pair
    free = free_runs[1]
    early = free.token_ids[2]
    params = SamplingParams(temperature=0, max_tokens=48, stop_token_ids=(early,), min_tokens=30, ignore_eos=True)
    a, b = spec.generate(PROMPTS[1], params)[0], plain.generate(PROMPTS[1], params)[0]
    assert a.token_ids == b.token_ids and len(a.token_ids) >= 30
    assert a.token_ids == free.token_ids[: len(a.token_ids)]
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(max_tokens=4, min_tokens=5)


def test_logprobs_come_from_the_target_distribution(pair):
    spec, plain = pair
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=3)
    a, b = spec.generate(PROMPTS[0], params)[0], plain.generate(PROMPTS[0], params)[0]
    assert len(a.logprobs) == len(a.token_ids) == 12
    assert [e.token_id for e in a.logprobs] == a.token_ids
    for x, y in zip(a.logprobs, b.logprobs, strict=True):
        assert x.logprob == pytest.approx(y.logprob, abs=1e-4)
        assert x.top[0][0] == x.token_id and len(x.top) == 3  # greedy: the chosen token is the most likely
        assert [v for _, v in x.top] == sorted((v for _, v in x.top), reverse=True)
    ids = plain.tokenizer.encode(PROMPTS[0], add_special_tokens=False)
    first = torch.log_softmax(plain.last_logits(ids), dim=-1)[a.token_ids[0]].item()
    assert a.logprobs[0].logprob == pytest.approx(first, abs=1e-4)
    assert spec.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=2))[0].logprobs is None


@pytest.mark.parametrize(
    ("kwargs", "field"), [({"stop": ("",)}, "stop"), ({"stop": (3,)}, "stop"), ({"logprobs": 21}, "logprobs")]
)
def test_bad_sampling_fields_are_refused(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_generate_progress_bar(pair, capsys):
    out = pair[1].generate(PROMPTS[:2], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True), use_tqdm=True)
    assert len(out) == 2 and "2/2" in capsys.readouterr().err


class _WholeDecode:
    """The scan as it was before incremental decoding: the whole output decoded after every token."""

    def __init__(self, stops, decode):
        self.stops, self.decode, self.longest, self.checked = stops, decode, max(map(len, stops)), 0

    def find(self, ids):
        text = self.decode(ids)
        start = max(0, self.checked - self.longest + 1)
        hits = [i for i in (text.find(s, start) for s in self.stops) if i >= 0]
        self.checked = len(text.rstrip("\ufffd"))
        return min(hits) if hits else None


def _streams(tokenizer):
    """Token streams that split characters: random ids (bytes that often are not UTF-8), and text
    whose multi-byte characters a small code vocabulary cuts across tokens."""
    rng = random.Random(7)
    text = "def f(x):\n    return 'héllo wörld — 日本語 😀' * x  # ünïcödé\n" * 6
    yield tokenizer.encode(text, add_special_tokens=False)
    for _ in range(6):
        yield [rng.randrange(tokenizer.vocab_size) for _ in range(160)]


def test_incremental_scan_stops_where_the_whole_decode_did(pair):
    tokenizer = pair[1].tokenizer

    def decode(ids):
        return tokenizer.decode(ids, skip_special_tokens=True)

    rng = random.Random(3)
    for ids in _streams(tokenizer):
        full = decode(ids)
        for _ in range(4):
            at = rng.randrange(len(full) - 4)
            stops = (full[at : at + rng.randint(1, 4)], full[rng.randrange(len(full)) :][:2] or "x", "@@never@@")
            new, old = StopStrings(stops, decode), _WholeDecode(stops, decode)
            assert [new.find(ids[:n]) for n in range(1, len(ids) + 1)] == [
                old.find(ids[:n]) for n in range(1, len(ids) + 1)
            ]
        text = Detokenizer(decode, 3)
        for n in range(1, len(ids) + 1):
            text.feed(ids[:n])
            window, origin = text.window
            assert decode(ids[:n])[origin:] == window  # final text + tail is the whole decode
