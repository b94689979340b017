"""Checkpoints the engine would serve wrongly are refused at load with a CheckpointError that says why:
sliding-window attention, non-float or non-finite weights, quantized or biased or non-SwiGLU configs,
config entries of the wrong type. Each case edits a real-format tiny checkpoint (save_pretrained)."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine import Engine, EngineConfig, SamplingParams
from engine.loader import CheckpointError
from engine.models.config import DFlashConfig, Qwen3Config
from tests.checkpoints import make_drafter, make_target


def _copy(tmp_path, source, config: dict | None = None, tensors=None):
    """A copy of a checkpoint with config.json entries replaced (None deletes) and tensors edited in place."""
    directory = tmp_path / "ckpt"
    shutil.copytree(source, directory)
    cfg = json.loads((directory / "config.json").read_text())
    for key, value in (config or {}).items():
        cfg.pop(key, None) if value is None else cfg.__setitem__(key, value)
    (directory / "config.json").write_text(json.dumps(cfg))
    if tensors is not None:
        weights = load_file(str(directory / "model.safetensors"))
        tensors(weights)
        save_file(weights, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory


def _load(target, drafter=None, **kwargs) -> Engine:
    return Engine(EngineConfig(model=str(target), draft_model=drafter and str(drafter), device="cpu", **kwargs))


SLIDING = "sliding_attention"
FULL = "full_attention"


@pytest.mark.parametrize(
    "config",
    [
        dict(use_sliding_window=True, sliding_window=8, layer_types=[SLIDING] * 3),
        dict(use_sliding_window=True, sliding_window=8, layer_types=None, max_window_layers=0),
        dict(layer_types=[FULL, SLIDING, FULL]),  # no window at all: transformers cannot run it either
        dict(use_sliding_window=True, sliding_window=511, layer_types=[FULL, FULL, SLIDING]),
    ],
    ids=["all-layers", "from-max_window_layers", "typed-without-window", "window-below-max-positions"],
)
def test_sliding_window_target_is_refused(tmp_path, tiny_target, config):
    with pytest.raises(CheckpointError, match="sliding-window attention .* not supported: the engine runs full"):
        _load(_copy(tmp_path, tiny_target, config))


def test_sliding_window_drafter_is_refused(tmp_path, tiny_target, tiny_drafter):
    drafter = _copy(tmp_path, tiny_drafter, dict(use_sliding_window=True, sliding_window=4, layer_types=[SLIDING] * 2))
    with pytest.raises(CheckpointError, match="sliding-window attention"):
        _load(tiny_target, drafter)


def test_unknown_layer_type_is_refused(tmp_path, tiny_target):
    with pytest.raises(CheckpointError, match=r"layer_types \['linear_attention'\] are not supported"):
        _load(_copy(tmp_path, tiny_target, dict(layer_types=[FULL, "linear_attention", FULL])))


@pytest.mark.parametrize(
    "config",
    [
        dict(use_sliding_window=True, sliding_window=8, max_window_layers=28, layer_types=None),
        dict(use_sliding_window=True, sliding_window=512, layer_types=[SLIDING] * 3),
    ],
    ids=["no-layer-reaches-max_window_layers", "window-covers-max-positions"],
)
def test_sliding_window_that_never_applies_serves_like_transformers(tmp_path, config):
    from transformers import Qwen3ForCausalLM

    make_target(tmp_path / "src")
    directory = _copy(tmp_path, tmp_path / "src", config)
    hf = Qwen3ForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()
    prompt = list(range(3, 40))
    out = _load(directory).generate([prompt], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))[0]
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert out.token_ids == ref[0, len(prompt) :].tolist()


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.float8_e4m3fn], ids=str)
def test_non_float_weight_is_refused_naming_tensor_and_dtype(tmp_path, tiny_target, dtype):
    name = "model.layers.1.mlp.up_proj.weight"

    def quantize(weights):
        weights[name] = (weights[name] * 100).clamp(-100, 100).to(dtype)

    directory = _copy(tmp_path, tiny_target, tensors=quantize)
    dtype_name = str(dtype).removeprefix("torch.")
    with pytest.raises(CheckpointError, match=f"tensor '{name}' has dtype {dtype_name}; the engine loads unquantized"):
        _load(directory)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_target_weight_is_refused_naming_the_tensor(tmp_path, tiny_target, value):
    name = "model.layers.2.self_attn.o_proj.weight"

    def poison(weights):
        weights[name][3, 5] = value
        weights[name][7, 1] = value

    with pytest.raises(CheckpointError, match=f"tensor '{name}' has 2 non-finite values"):
        _load(_copy(tmp_path, tiny_target, tensors=poison))


def test_non_finite_drafter_weight_is_refused_naming_the_tensor(tmp_path, tiny_target, tiny_drafter):
    def poison(weights):
        weights["fc.weight"][0, 0] = math.nan

    with pytest.raises(CheckpointError, match="tensor 'fc.weight' has 1 non-finite values"):
        _load(tiny_target, _copy(tmp_path, tiny_drafter, tensors=poison))


def test_weight_that_overflows_the_compute_dtype_is_refused(tmp_path, tiny_target):
    name = "model.layers.0.mlp.down_proj.weight"

    def huge(weights):
        weights[name][0, 0] = 1e6  # finite in float32, inf in float16

    directory = _copy(tmp_path, tiny_target, tensors=huge)
    _load(directory)  # float32 serves it
    with pytest.raises(CheckpointError, match=f"tensor '{name}' has 1 non-finite values .* in float16"):
        _load(directory, dtype="float16")


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (dict(quantization_config={"quant_method": "fp8"}), r"quantized checkpoint \(fp8\)"),
        (dict(attention_bias=True), "attention_bias=true is not supported"),
        (dict(hidden_act="gelu"), "hidden_act='gelu' is not supported"),
        (dict(hidden_size=64.5), "hidden_size=64.5; expected an int"),
        (dict(num_hidden_layers="3"), "num_hidden_layers='3'; expected an int"),
        (dict(head_dim=True), "head_dim=True; expected an int"),
        (dict(vocab_size=0), "vocab_size=0; expected an int >= 1"),
        (dict(rms_norm_eps=-1e-6), "rms_norm_eps=-1e-06; expected a finite number > 0"),
        (dict(rope_parameters={"rope_type": "default", "rope_theta": "1e4"}), "rope_theta='1e4'"),
        (dict(eos_token_id="299"), "eos_token_id='299'"),
        (dict(eos_token_id=[299, 1.5]), r"eos_token_id=\[299, 1.5\]"),
        (dict(tie_word_embeddings="false"), "tie_word_embeddings='false'; expected true or false"),
        (dict(layer_types=[FULL]), r"expected one entry per layer \(3\)"),
    ],
)
def test_target_config_the_engine_would_misread_is_refused(tiny_target, config, message):
    d = json.loads((tiny_target / "config.json").read_text()) | config
    with pytest.raises(CheckpointError, match=message):
        Qwen3Config.from_dict(d, "t")


@pytest.mark.parametrize(
    ("nested", "message"),
    [
        (dict(block_size="6"), "block_size='6'; expected an int >= 2"),
        (dict(mask_token_id=298.0), "mask_token_id=298.0; expected an int >= 0"),
        (dict(target_layer_ids=[0.0, 1]), r"target_layer_ids=\[0.0, 1\]; expected a list of layer indices"),
        (dict(target_layer_ids="0,1"), "target_layer_ids='0,1'"),
    ],
)
def test_drafter_config_of_the_wrong_type_is_refused(tmp_path, nested, message):
    make_drafter(tmp_path)
    d = json.loads((tmp_path / "config.json").read_text())
    d["dflash_config"] |= nested
    with pytest.raises(CheckpointError, match=message):
        DFlashConfig.from_dict(d, "d")
