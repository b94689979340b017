"""The known-continuation target: every greedy step repeats the last prompt token (engine/fixture/known/target.py)."""

from __future__ import annotations

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.fixture.known.geometry import QWEN3_4B, random_prompts
from engine.fixture.known.target import EMBED, continuation, echo_failures, known_target

# The 4B construction, narrowed to fit a CPU test: the full depth (36 layers), 4B head layout ratios.
SCALED = {
    **QWEN3_4B,
    "hidden_size": 128,
    "intermediate_size": 486,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "vocab_size": 4096,
}


def _hf_model(checkpoint):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = {k: v for k, v in checkpoint.config.items() if k not in ("architectures", "model_type")}
    model = Qwen3ForCausalLM(Qwen3Config(**cfg)).eval()
    model.load_state_dict(checkpoint.tensors, strict=False)
    model.tie_weights()
    return model


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_repeats_the_last_prompt_token_for_300_steps(dtype):
    """Teacher-forced on the known continuation, the target's argmax at every one of 300 positions is the
    token itself: the greedy trajectory, all positions at once (transformers' Qwen3 as the reference)."""
    ckpt = known_target(SCALED, torch.device("cpu"), dtype, seed=3)
    model = _hf_model(ckpt).to(dtype)
    prompts = random_prompts(8, 16, SCALED["vocab_size"], seed=5)
    ids = torch.tensor([p + continuation(p, 300) for p in prompts])
    with torch.no_grad():
        greedy = model(ids).logits[:, 15:].argmax(-1)  # the prediction after the last prompt token onwards
    assert (greedy == ids[:, -1:]).all(), "some step did not repeat the last prompt token"


@pytest.mark.usefixtures("one_thread")
def test_engine_generates_the_known_continuation():
    ckpt = known_target({**SCALED, "num_hidden_layers": 4}, torch.device("cpu"), torch.float32, seed=1)
    engine = Engine(EngineConfig(model=ckpt, device="cpu", max_num_seqs=4, max_model_len=64, trace=False))
    prompts = random_prompts(4, 8, SCALED["vocab_size"], seed=2)
    outs = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    assert echo_failures(prompts, [o.token_ids for o in outs]) == []
    assert outs[0].token_ids == [prompts[0][-1]] * 24


def test_construction_and_checks():
    ckpt = known_target(dict(SCALED, num_hidden_layers=1), torch.device("cpu"), torch.float32)
    assert ckpt.tensors[EMBED].std().item() == pytest.approx(1.0, rel=0.05)
    assert ckpt.tensors["model.layers.0.mlp.up_proj.weight"].std().item() == pytest.approx(0.002, rel=0.05)
    assert "lm_head.weight" not in ckpt.tensors  # tied
    with pytest.raises(ValueError, match="tied"):
        known_target(dict(SCALED, tie_word_embeddings=False), torch.device("cpu"), torch.float32)
    assert echo_failures([[1, 2], [3]], [[2, 2, 9], [3]]) == [(0, 2)]
    with pytest.raises(ValueError, match="non-empty"):
        continuation([], 3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_full_4b_geometry_echoes_on_the_gpu():
    """The study's target as the bench builds it: Qwen3-4B shapes, bf16, triton, CUDA graphs, 64 prompts
    decoded together for 256 greedy steps."""
    ckpt = known_target("4b", torch.device("cuda"), torch.bfloat16)
    cfg = EngineConfig(model=ckpt, device="cuda", max_num_seqs=64, max_model_len=300, num_kv_blocks=64 * 19 + 4)
    engine = Engine(cfg)
    prompts = random_prompts(64, 16, QWEN3_4B["vocab_size"], seed=11)
    outs = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=256, ignore_eos=True))
    assert echo_failures(prompts, [o.token_ids for o in outs]) == []
