"""Bad input gets a clear error and loses nothing: the rest of the batch still finishes correctly."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from engine import Engine, EngineConfig, SamplingParams
from engine.loader import CheckpointError
from tests.checkpoints import make_drafter


@pytest.fixture(scope="module")
def engine(tiny_target):
    return Engine(EngineConfig(model=str(tiny_target), device="cpu", max_model_len=64))


GOOD = [[5, 6, 7, 8], [1, 2, 3]]


def _alone(engine, prompts, params):
    return [engine.generate([p], params)[0].token_ids for p in prompts]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ([], "empty prompt"),
        ([1] * 64, "longer than the context limit 64"),
        ([1] * 40, r"prompt \(40 tokens\) \+ max_tokens \(30\) = 70 exceeds the context limit 64"),
        ([1, 2, 999], "outside the vocabulary"),
        ("text", "no tokenizer"),
        ([1.7, 2.2], r"token ids must be ints; item 0 is 1.7"),
        ([4, True], r"token ids must be ints; item 1 is True"),
    ],
)
def test_bad_request_is_rejected_and_others_finish(engine, bad, message):
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    outs = engine.generate([GOOD[0], bad, GOOD[1]], params)
    assert outs[1].finish_reason == "rejected" and outs[1].token_ids == []
    assert re.search(message, outs[1].error)
    assert [outs[0].token_ids, outs[2].token_ids] == _alone(engine, GOOD, params)


def test_stop_token_outside_the_vocabulary_is_rejected_and_others_finish(engine):
    good = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    bad = SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[7, 99999])
    outs = engine.generate(GOOD, [good, bad])
    assert outs[1].finish_reason == "rejected" and outs[1].token_ids == []
    assert "stop_token_ids: 99999 is outside the vocabulary [0, 300)" in outs[1].error
    assert outs[0].token_ids == _alone(engine, GOOD[:1], good)[0]


@pytest.mark.parametrize("max_tokens", [0, -3, 1.5, True])
def test_bad_max_tokens_is_a_clear_error(max_tokens):
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=max_tokens)


@pytest.mark.parametrize(("field", "value"), [("temperature", -0.1), ("top_p", 0.0), ("top_p", 1.5), ("top_k", -2)])
def test_bad_sampling_params(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_missing_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="no such directory"):
        Engine(EngineConfig(model=str(tmp_path / "nope"), device="cpu"))


def test_missing_config(tmp_path, tiny_target):
    shutil.copytree(tiny_target, tmp_path / "ckpt")
    (tmp_path / "ckpt" / "config.json").unlink()
    with pytest.raises(CheckpointError, match="missing config.json"):
        Engine(EngineConfig(model=str(tmp_path / "ckpt"), device="cpu"))


def test_corrupt_safetensors(tmp_path, tiny_target):
    shutil.copytree(tiny_target, tmp_path / "ckpt")
    weights = tmp_path / "ckpt" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="cannot read safetensors"):
        Engine(EngineConfig(model=str(tmp_path / "ckpt"), device="cpu"))


def test_missing_tensor(tmp_path, tiny_target):
    from safetensors.torch import load_file, save_file

    shutil.copytree(tiny_target, tmp_path / "ckpt")
    weights = tmp_path / "ckpt" / "model.safetensors"
    tensors = load_file(str(weights))
    del tensors["model.layers.1.mlp.down_proj.weight"]
    save_file(tensors, str(weights))
    with pytest.raises(CheckpointError, match="missing tensor 'model.layers.1.mlp.down_proj.weight'"):
        Engine(EngineConfig(model=str(tmp_path / "ckpt"), device="cpu"))


def test_shard_index_naming_a_missing_shard(tmp_path, tiny_target):
    shutil.copytree(tiny_target, tmp_path / "ckpt")
    index = {"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}
    (tmp_path / "ckpt" / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="shards that do not exist: model-00002-of-00002"):
        Engine(EngineConfig(model=str(tmp_path / "ckpt"), device="cpu"))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(hidden=32, head_dim=8), "drafter hidden_size=32 does not match the target's hidden_size=64"),
        (dict(taps=(1, 0)), "strictly increasing"),
        (dict(taps=(0, 3)), "out of range for a target with 3 layers"),
        (dict(num_target_layers=36), "num_target_layers=36 does not match the target's num_target_layers=3"),
    ],
)
def test_drafter_that_does_not_fit_the_target(tmp_path, tiny_target, kwargs, message):
    make_drafter(tmp_path, **kwargs)
    with pytest.raises(CheckpointError, match=message):
        Engine(EngineConfig(model=str(tiny_target), draft_model=str(tmp_path), device="cpu"))


def test_request_in_the_drafters_headroom_is_rejected(tiny_target, tiny_drafter):
    engine = Engine(EngineConfig(model=str(tiny_target), draft_model=str(tiny_drafter), device="cpu", max_model_len=64))
    # block_size 6: prompt + budget may use at most 64 - 6 = 58 positions.
    outs = engine.generate(
        [[1] * 16, [2] * 16],
        [SamplingParams(temperature=0, max_tokens=42), SamplingParams(temperature=0, max_tokens=43)],
    )
    assert outs[0].finish_reason != "rejected"
    assert outs[1].finish_reason == "rejected"
    assert "minus the drafter's block headroom 6" in outs[1].error


def test_not_a_qwen3_checkpoint(tmp_path, tiny_target):
    shutil.copytree(tiny_target, tmp_path / "ckpt")
    cfg = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    cfg.update(model_type="llama", architectures=["LlamaForCausalLM"])
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="not a Qwen3 dense checkpoint"):
        Engine(EngineConfig(model=str(tmp_path / "ckpt"), device="cpu"))


@pytest.fixture(scope="module")
def text_engine(shipped_tiny, one_thread):
    return Engine(EngineConfig(model=str(shipped_tiny[0]), device="cpu", max_model_len=64))


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("ok \ud800 text", r"prompt 1 is not valid text: a lone surrogate U\+D800 at character 3"),
        ("tail\udfff", r"prompt 1 is not valid text: a lone surrogate U\+DFFF at character 4"),
        ("ab\udcff", r"prompt 1 is not valid text: an undecodable byte 0xff at character 2"),  # surrogateescape
        ({"prompt": "x\ud83d"}, r"prompt 1 is not valid text: a lone surrogate U\+D83D at character 1"),
    ],
)
def test_invalid_text_is_rejected_alone_naming_prompt_and_position(text_engine, bad, message):
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    outs = text_engine.generate(["def main():\n", bad, "import os\n"], params)
    assert outs[1].finish_reason == "rejected" and outs[1].token_ids == [] and re.search(message, outs[1].error)
    alone = [text_engine.generate(p, params)[0].token_ids for p in ("def main():\n", "import os\n")]
    assert [outs[0].token_ids, outs[2].token_ids] == alone
    assert not text_engine.has_unfinished()  # nothing left behind for a later step()


def test_add_request_names_the_prompt_and_the_position(text_engine):
    rid = text_engine.add_request("\ud800", SamplingParams(max_tokens=2))
    (out,) = text_engine.step()
    assert out.request_id == rid and out.finish_reason == "rejected"
    assert out.error == "prompt is not valid text: a lone surrogate U+D800 at character 0"
    assert not text_engine.has_unfinished()


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ("max_tokens=3", "params must be a SamplingParams"),
        ({"max_tokens": 3, "presence": 1}, "SamplingParams has no field 'presence'"),
        ({"max_tokens": 0}, "SamplingParams.max_tokens"),
        ([SamplingParams(max_tokens=2), 7], "got int"),
        ([SamplingParams(max_tokens=2)], "2 prompts but 1 SamplingParams"),
    ],
)
def test_bad_params_raise_before_any_prompt_is_admitted(text_engine, params, message):
    index = text_engine._next_index
    with pytest.raises(ValueError, match=re.escape(message)):
        text_engine.generate(["def main():\n", "import os\n"], params)
    assert text_engine._next_index == index and not text_engine.has_unfinished()


def test_a_failure_while_admitting_takes_back_what_it_admitted(text_engine, monkeypatch):
    calls = []

    def encode(text: str, add_special_tokens: bool = False) -> list[int]:
        calls.append(text)
        if len(calls) == 2:
            raise KeyboardInterrupt  # not a refusal: the batch stops, and its first request must go too
        return [5, 6, 7]

    monkeypatch.setattr(text_engine.tokenizer, "encode", encode)
    with pytest.raises(KeyboardInterrupt):
        text_engine.generate(["a", "b", "c"], SamplingParams(max_tokens=3))
    assert not text_engine.has_unfinished() and text_engine.blocks.num_free == text_engine.blocks.capacity


def test_a_tokenizer_that_refuses_a_prompt_rejects_it_alone(text_engine, monkeypatch):
    real = text_engine.tokenizer.encode

    def encode(text: str, add_special_tokens: bool = False) -> list[int]:
        if text == "boom":
            raise TypeError("cannot encode this")
        return real(text, add_special_tokens=add_special_tokens)

    monkeypatch.setattr(text_engine.tokenizer, "encode", encode)
    outs = text_engine.generate(["def f", "boom"], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    assert outs[0].finish_reason == "length" and outs[1].finish_reason == "rejected"
    assert outs[1].error == "prompt 1 could not be tokenized: TypeError: cannot encode this"


def test_params_as_a_dict_are_taken_as_keyword_arguments(text_engine):
    as_dict = text_engine.generate("def main():\n", {"max_tokens": 5, "temperature": 0, "ignore_eos": True})
    typed = text_engine.generate("def main():\n", SamplingParams(max_tokens=5, temperature=0, ignore_eos=True))
    assert as_dict[0].token_ids == typed[0].token_ids and len(typed[0].token_ids) == 5
    many = text_engine.generate(["a", "b"], [{"max_tokens": 2}, {"max_tokens": 3, "ignore_eos": True}])
    assert len(many[1].token_ids) == 3


def test_top_k_minus_one_is_off_like_zero(text_engine):
    runs = [
        text_engine.generate("import os\n", SamplingParams(max_tokens=8, top_k=k, seed=5, ignore_eos=True))[0]
        for k in (0, -1)
    ]
    assert runs[0].token_ids == runs[1].token_ids
