"""A DFlash drafter may tap the target's last layer. The reference (z-lab, on HF hidden_states) feeds
hidden_states[num_layers] there, which is after the final norm; the engine captures exactly that, so
its drafter context equals an eager store of HF's features after every step."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3ForCausalLM as HFQwen3

from engine import Engine, EngineConfig, SamplingParams
from tests.checkpoints import make_drafter
from tests.kv_checks import check_draft_kv

PROMPTS = [list(range(3, 20)), [7, 7, 8, 9, 250, 4], list(range(100, 131))]


@pytest.fixture(scope="module")
def hf(tiny_target):
    return HFQwen3.from_pretrained(str(tiny_target), dtype=torch.float32).eval()


def test_hf_last_hidden_state_is_the_final_normed_one(hf, one_thread):
    """Why the last tap is special: HF's last entry is normed, unlike the residual after that layer."""
    raw = {}
    hook = hf.model.layers[-1].register_forward_hook(lambda mod, args, out: raw.setdefault("h", out))
    with torch.no_grad():
        hs = hf(input_ids=torch.tensor([PROMPTS[0]]), output_hidden_states=True).hidden_states
    hook.remove()
    assert len(hs) == hf.config.num_hidden_layers + 1
    torch.testing.assert_close(hs[-1], hf.model.norm(raw["h"]))
    assert (hs[-1] - raw["h"]).abs().max() > 0.1


@pytest.mark.parametrize("taps", [(0, 2), (2,)], ids=["first-and-last", "last-only"])
def test_drafter_context_from_the_last_layer_equals_hf(tmp_path, tiny_target, hf, taps, one_thread):
    make_drafter(tmp_path, taps=taps)
    engine = Engine(EngineConfig(model=str(tiny_target), draft_model=str(tmp_path), device="cpu"))
    for prompt, budget in zip(PROMPTS, (30, 24, 18), strict=True):
        engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=budget, ignore_eos=True))
    checked = 0
    with torch.no_grad():
        while engine.has_unfinished():
            engine.step()
            checked += check_draft_kv(engine, hf)
    assert checked > 10 and engine.stats.rounds > 5
