"""Incremental detokenization (engine/stopping.py, the server's streamed Choice) against the whole
decode, on token streams of the shipped tiny tokenizer (byte-level BPE: characters outside ASCII
are split over several byte tokens), where a mistake would be silent: a stop found a token late or
at the wrong offset, text lost or doubled in a stream, work that grows with the output."""

from __future__ import annotations

import json
import random
from functools import partial

import pytest

from engine import Engine, EngineConfig, SamplingParams
from engine.outputs import RequestOutput
from engine.serve.text import Choice
from engine.shipped import shipped_pair
from engine.stopping import Detokenizer, StopStrings

UNICODE = "def f(x):\n    return 'héllo — wörld 日本語 😀' * x  # ünïcödé\n"


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(shipped_pair("tiny")[0]))


def _decoder(tokenizer, skip: bool = True):
    return partial(tokenizer.decode, skip_special_tokens=skip)


def _streams(tokenizer) -> list[list[int]]:
    """The shipped held-out prompts, unicode-heavy code, and both with the special tokens
    (<|endoftext|>, <|mask|>) dropped in at random places."""
    target = shipped_pair("tiny")[0]
    lines = (target.parent / "prompts.jsonl").read_text().splitlines()[:3]
    texts = [json.loads(line)["text"] for line in lines] + [UNICODE * 4]
    streams = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    rng, specials = random.Random(5), tokenizer.all_special_ids
    for ids in list(streams[-2:]):
        mixed = list(ids)
        for _ in range(6):
            mixed.insert(rng.randrange(len(mixed)), rng.choice(specials))
        streams.append(mixed)
    return streams


def _chunks(n: int, rng: random.Random) -> list[int]:
    """Prefix lengths fed: 1..8 tokens at a time, as speculative rounds and streamed steps commit."""
    ends, at = [], 0
    while at < n:
        at = min(n, at + rng.randint(1, 8))
        ends.append(at)
    return ends


@pytest.mark.parametrize("skip", [True, False])
def test_detokenizer_text_is_the_whole_decode(tokenizer, skip):
    decode, rng = _decoder(tokenizer, skip), random.Random(11)
    for ids in _streams(tokenizer):
        for ends in (range(1, len(ids) + 1), _chunks(len(ids), rng)):
            text = Detokenizer(decode, 4)
            for n in ends:
                text.feed(ids[:n])
                window, origin = text.window
                whole = decode(ids[:n])
                assert whole[origin:] == window and text.done + len(text.tail) == len(whole), n


def test_work_per_token_does_not_grow_with_the_output(tokenizer):
    decode = _decoder(tokenizer)
    ids = [t for s in _streams(tokenizer)[:3] for t in s][:2000]
    decoded = []

    def counting(part):
        decoded.append(len(part))
        return decode(part)

    stops = StopStrings(["@@never@@"], counting)
    assert all(stops.find(ids[:n]) is None for n in range(1, len(ids) + 1))
    assert max(decoded) < 32 and sum(decoded) < 8 * len(ids)  # the whole decode: len(ids) ** 2 / 2


def _boundary_stream(tokenizer) -> tuple[list[int], list[str]]:
    ids = tokenizer.encode("def main():\n    return 1\n", add_special_tokens=False)
    return ids, [tokenizer.decode([t]) for t in ids]


def test_a_stop_string_spanning_a_token_boundary_is_found_at_the_token_that_completes_it(tokenizer):
    ids, pieces = _boundary_stream(tokenizer)
    assert pieces[:4] == ["def", " main", "():", "\n   "]  # the stops below straddle these boundaries
    whole = "".join(pieces)
    for stop, last in (("():\n", 3), (" main()", 2), ("f main", 1)):
        stops = StopStrings(["@@", stop], _decoder(tokenizer))
        found = [stops.find(ids[:n]) for n in range(1, len(ids) + 1)]
        assert found == [whole.find(stop) if i == last else None for i in range(len(ids))], stop
        assert stops.matched == stop


def test_a_multibyte_character_split_across_tokens(tokenizer):
    decode = _decoder(tokenizer)
    for stop, before in (("é", "h"), ("日本語", "x "), ("😀", "ab"), ("o — w", "hell")):
        ids = tokenizer.encode(before + stop + " tail", add_special_tokens=False)
        done = len(tokenizer.encode(before + stop, add_special_tokens=False))
        assert done - len(tokenizer.encode(before, add_special_tokens=False)) > 1  # split over tokens
        stops, text = StopStrings([stop], decode), Detokenizer(decode, 0)
        found = [stops.find(ids[:n]) for n in range(1, len(ids) + 1)]
        assert found == [len(before) if n == done else None for n in range(1, len(ids) + 1)], stop
        for n in range(1, len(ids) + 1):  # mid-character the tail ends in U+FFFD and stays the tail
            text.feed(ids[:n])
            assert text.done + len(text.tail) == len(decode(ids[:n]))
            assert "\ufffd" not in text.window[0][: text.done - text.window[1]]  # final text is whole


def test_a_stop_at_the_very_first_token(tokenizer):
    ids, pieces = _boundary_stream(tokenizer)
    for stop in (pieces[0], pieces[0][:1], pieces[0][1:]):
        stops = StopStrings([stop, "@@"], _decoder(tokenizer))
        assert stops.find(ids[:1]) == pieces[0].find(stop) and stops.matched == stop
        assert stops.find(ids[:2]) is None  # found once, at the token that completed it


@pytest.fixture(scope="module")
def engines(one_thread):
    target, drafter = shipped_pair("tiny")
    spec = Engine(EngineConfig(model=str(target), draft_model=str(drafter), device="cpu", max_num_seqs=2))
    return spec, Engine(EngineConfig(model=str(target), device="cpu", max_num_seqs=2))


def test_the_engine_stops_at_its_first_token(engines):
    spec, plain = engines
    greedy = dict(temperature=0, max_tokens=16, ignore_eos=True)
    (free,) = plain.generate("def main():\n", SamplingParams(**greedy))
    first = plain.tokenizer.decode(free.token_ids[:1])
    for engine in engines:
        for include in (False, True):
            params = SamplingParams(**greedy, stop=[first], include_stop_str_in_output=include)
            (out,) = engine.generate("def main():\n", params)
            assert out.token_ids == free.token_ids[:1] and out.finish_reason == "stop"
            assert out.text == (first if include else "") and out.outputs[0].stop_reason == first


def _whole_decode_deltas(decode, hold: int, outs: list[RequestOutput]) -> list[str]:
    """The streamed deltas as the server sent them before: the whole output decoded each update."""
    sent, deltas = "", []
    for out in outs:
        text = out.text if out.finished else decode(out.token_ids).rstrip("\ufffd")
        text = text if out.finished else text[: max(0, len(text) - hold)]
        deltas.append(text[len(sent) :] if len(text) > len(sent) else "")
        sent = text if len(text) > len(sent) else sent
    return deltas


@pytest.mark.parametrize("stop", [(), ("@@never@@",), ("é",)])
def test_streamed_deltas_match_the_whole_decode(tokenizer, stop):
    decode, rng = _decoder(tokenizer), random.Random(2)
    params = SamplingParams(stop=stop)
    for ids in _streams(tokenizer):
        ends = _chunks(len(ids), rng)
        outs = [RequestOutput("r", [], ids[:n], [], False, None) for n in ends]
        outs[-1] = RequestOutput("r", [], ids, [], True, "length", text=decode(ids))
        choice = Choice(0, tokenizer, params)
        deltas = [choice.update(o) for o in outs]
        hold = max(map(len, stop), default=1) - 1
        assert deltas == _whole_decode_deltas(decode, hold, outs)
        assert "".join(deltas) == decode(ids) and choice.sent == len(decode(ids))
        quiet = Choice(0, tokenizer, params, stream=False)  # not streamed: the final text only
        assert [quiet.update(o) for o in outs] == [""] * (len(outs) - 1) + [decode(ids)]
