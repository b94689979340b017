"""SamplingParams, EngineConfig and prompt token ids: a wrong type or value is refused at construction
with a ValueError that names the field, never coerced and never left to fail inside a step."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from engine import EngineConfig, SamplingParams
from engine.config import as_sampling_params, text_error
from engine.tokenizing import encode_prompt


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", math.nan),
        ("temperature", math.inf),
        ("temperature", "0.7"),
        ("temperature", True),
        ("temperature", 1e-30),
        ("top_p", math.nan),
        ("top_p", "0.9"),
        ("top_k", 2.5),
        ("top_k", "40"),
        ("top_k", True),
        ("seed", "abc"),
        ("seed", 2**70),
        ("seed", 2**64),
        ("seed", -1),
        ("seed", 1.0),
        ("seed", True),
        ("max_tokens", "16"),
        ("max_tokens", 16.0),
        ("ignore_eos", 1),
        ("speculate", "no"),
        ("stop_token_ids", [1.0]),
        ("stop_token_ids", ["7"]),
        ("stop_token_ids", [True]),
        ("stop_token_ids", [-1]),
        ("stop_token_ids", "12"),
        ("stop_token_ids", 12),
    ],
)
def test_sampling_params_refuse_with_the_field_named(field, value):
    with pytest.raises(ValueError, match=f"SamplingParams.{field}"):
        SamplingParams(**{field: value})


def test_tiny_temperature_points_to_greedy():
    with pytest.raises(ValueError, match="use 0 for greedy"):
        SamplingParams(temperature=1e-6)


def test_sampling_params_accept_and_normalise_good_values():
    p = SamplingParams(temperature=1, top_p=1, top_k=np.int64(5), seed=2**64 - 1, stop_token_ids=[np.int32(3), 4])
    assert (p.temperature, p.top_p, p.top_k, p.seed, p.stop_token_ids) == (1.0, 1.0, 5, 2**64 - 1, (3, 4))
    assert type(p.temperature) is float and type(p.top_k) is int and all(type(t) is int for t in p.stop_token_ids)
    torch.Generator().manual_seed(p.seed)  # the whole accepted range seeds a generator
    assert SamplingParams(temperature=0).greedy and SamplingParams(stop_token_ids={9}).stop_token_ids == (9,)


def test_stop_token_ids_checked_against_the_vocabulary():
    SamplingParams(stop_token_ids=[0, 299]).validate_for(300)
    with pytest.raises(ValueError, match=r"stop_token_ids: 300 is outside the vocabulary \[0, 300\)"):
        SamplingParams(stop_token_ids=[5, 300]).validate_for(300)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_num_seqs", "4"),
        ("max_num_seqs", 4.0),
        ("max_num_seqs", True),
        ("max_num_seqs", 0),
        ("max_num_batched_tokens", None),
        ("kv_block_size", 16.5),
        ("max_model_len", "64"),
        ("max_model_len", 1),
        ("num_kv_blocks", 8.0),
        ("draft_window", -1),
        ("draft_window", "128"),
        ("draft_window", 64.0),
        ("seed", "1"),
        ("seed", -1),
        ("seed", 2**32),
        ("cuda_graphs", "false"),
        ("decode_overlap", 0),
        ("batch_invariant", 1),
        ("trace", "yes"),
        ("gpu_memory_utilization", "0.9"),
        ("gpu_memory_utilization", math.nan),
        ("gpu_memory_utilization", True),
        ("gpu_memory_utilization", 1.5),
        ("draft_model", 3),
        ("model", ["a/b"]),
    ],
)
def test_engine_config_refuses_with_the_field_named(field, value):
    with pytest.raises(ValueError, match=f"EngineConfig.{field}"):
        EngineConfig(**{"model": "some/model", field: value})


def test_engine_config_accepts_paths_and_normalises_ints(tmp_path):
    cfg = EngineConfig(model=tmp_path, max_num_seqs=np.int64(4), gpu_memory_utilization=1)
    assert type(cfg.max_num_seqs) is int and cfg.gpu_memory_utilization == 1.0


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ([1.7, 2.2], r"item 0 is 1.7 \(float\)"),
        ([3, 2.0], r"item 1 is 2.0 \(float\)"),
        ([True, 5], r"item 0 is True \(bool\)"),
        ([5, "6"], r"item 1 is '6' \(str\)"),
        ([[1, 2]], r"item 0 is \[1, 2\] \(list\)"),
        (torch.tensor([1.5, 2.0]), r"item 0 is 1.5 \(float\)"),
        (b"abc", "got bytes"),
        (7, "got int"),
        (torch.tensor(7), "got Tensor"),
    ],
)
def test_prompt_token_ids_must_be_ints(prompt, message):
    ids, why = encode_prompt(None, prompt)
    assert ids == [] and why is not None
    assert re.search(message, why), why


@pytest.mark.parametrize(
    "prompt", [[5, 6, 7], (5, 6, 7), np.array([5, 6, 7]), torch.tensor([5, 6, 7]), [np.int64(5), 6, 7]]
)
def test_prompt_token_ids_in_the_usual_containers(prompt):
    ids, why = encode_prompt(None, prompt)
    assert (ids, why) == ([5, 6, 7], None) and all(type(t) is int for t in ids)


def test_defaults_are_vllms():
    p = SamplingParams()
    assert (p.temperature, p.top_k, p.top_p, p.max_tokens) == (1.0, 0, 1.0, 16) and not p.greedy
    assert SamplingParams(top_k=-1).top_k == -1  # vLLM's "off"; other negatives are refused above
    with pytest.raises(ValueError, match=r"SamplingParams.top_k=-2; expected an int >= -1"):
        SamplingParams(top_k=-2)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"max_tokens": 2, "temp": 1}, "SamplingParams has no field 'temp'"),
        ("max_tokens=2", "params must be a SamplingParams or a dict of its fields, got str"),
        ({"max_tokens": "2"}, "SamplingParams.max_tokens"),
    ],
)
def test_params_given_other_than_as_sampling_params(value, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        as_sampling_params(value)


def test_params_given_as_a_dict_or_none():
    assert as_sampling_params({"max_tokens": 3, "temperature": 0}) == SamplingParams(max_tokens=3, temperature=0)
    assert as_sampling_params(None) == SamplingParams()


def test_num_kv_blocks_says_block_zero_is_reserved():
    with pytest.raises(ValueError, match=r"num_kv_blocks=1; expected an int >= 2 \(blocks in all: block 0 is reserved"):
        EngineConfig(model="some/model", num_kv_blocks=1)


class _Tokenizer:
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("ok", None),
        ("\ud800", "a lone surrogate U+D800 at character 0"),
        ("abc\udbff\udc00"[:4], "a lone surrogate U+DBFF at character 3"),
        ("x\udc80", "an undecodable byte 0x80 at character 1"),
        ("😀 fine \U0010ffff", None),
    ],
)
def test_text_is_checked_naming_the_character(text, why):
    assert text_error(text) == why
    ids, error = encode_prompt(_Tokenizer(), text, "prompt 2")
    assert (error is None) == (why is None) and (not why or error == f"prompt 2 is not valid text: {why}")
    assert ids == ([] if why else [ord(c) for c in text])


def test_stop_strings_must_be_valid_text():
    with pytest.raises(ValueError, match=r"SamplingParams.stop\[1\] is not valid text: a lone surrogate U\+D800"):
        SamplingParams(stop=["ok", "\ud800"])


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ({"prompt": "ab"}, ([97, 98], None)),
        ({"prompt_token_ids": [5, 6]}, ([5, 6], None)),
        ({"prompt_token_ids": (5, 6)}, ([5, 6], None)),
        ({"prompt": "a", "multi_modal_data": {}}, ([], "prompt has key 'multi_modal_data', which this engine")),
        ({"prompt": "a", "prompt_token_ids": [1]}, ([], "prompt must have exactly one of")),
        ({}, ([], "prompt must have exactly one of")),
        ({"prompt": [1, 2]}, ([], "prompt['prompt'] must be a string, got list")),
        ({"prompt_token_ids": "12"}, ([], "prompt['prompt_token_ids'] must be token ids, got a string")),
        ({"prompt_token_ids": [1.5]}, ([], "prompt token ids must be ints; item 0 is 1.5")),
    ],
)
def test_vllm_style_dict_prompts(prompt, expected):
    ids, why = encode_prompt(_Tokenizer(), prompt)
    assert ids == expected[0] and (why is None if expected[1] is None else why.startswith(expected[1])), why
