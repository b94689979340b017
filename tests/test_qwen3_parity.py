"""The torch path against transformers' own Qwen3ForCausalLM on the same random weights."""

from __future__ import annotations

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from tests.checkpoints import make_target

PROMPTS = [[5, 6, 7, 8, 9, 10], [1, 2, 3], list(range(20, 60)), [250, 3, 17, 17, 99]]
VARIANTS = {
    "tied": dict(tied=True),
    "untied": dict(tied=False),
    "gqa4-headdim16": dict(tied=True, hidden=64, heads=8, kv_heads=2, head_dim=16),  # head_dim != hidden/heads
    "mqa-untied": dict(tied=False, hidden=64, heads=4, kv_heads=1, head_dim=24),
    "sharded": dict(tied=False, shards=3),
}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def pair(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    hf = make_target(directory, **VARIANTS[request.param])
    return hf, Engine(EngineConfig(model=str(directory), device="cpu"))


def test_last_position_logits_match(pair):
    hf, engine = pair
    for prompt in PROMPTS:
        with torch.no_grad():
            ref = hf(torch.tensor([prompt])).logits[0, -1]
        ours = engine.last_logits(prompt)
        # fp32 on both sides: only summation order differs.
        tol = 1e-4 * max(1.0, ref.abs().max().item())
        assert (ours - ref).abs().max().item() <= tol


def test_greedy_tokens_match_for_32_tokens(pair):
    hf, engine = pair
    outs = engine.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    for prompt, out in zip(PROMPTS, outs, strict=True):
        with torch.no_grad():
            ref = hf.generate(
                torch.tensor([prompt]), max_new_tokens=40, do_sample=False, eos_token_id=None, pad_token_id=0
            )[0, len(prompt) :].tolist()
        assert out.token_ids == ref
        assert out.finish_reason == "length"
