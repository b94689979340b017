"""The drafter's context: every target forward that captures features (prefill, decode, gated and
verify spans) stores them as drafter context K/V at the same slots, inside the same step.

Rows a round rejects are stored too, past the committed length, where no block looks and later
rows overwrite them. Checked two ways on the shipped tiny pair (fp32): the engine drafts exactly
what the reference loop drafts (which keeps only committed context), and after every step each
draft-ready request's context K/V equals an eager store of HF's features of its committed tokens.
"""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3ForCausalLM as HFQwen3

from engine import Engine, EngineConfig, SamplingParams
from tests.drafts import engine_drafts, reference_drafts
from tests.kv_checks import check_draft_kv

BUDGETS = [48, 20, 36]


@pytest.fixture(scope="module")
def pair(shipped_tiny):
    return shipped_tiny


@pytest.fixture(scope="module")
def prompt_ids(shipped_prompt_ids):
    return shipped_prompt_ids[: len(BUDGETS)]


def test_engine_drafts_like_the_reference_loop(pair, prompt_ids):
    target_dir, drafter_dir = pair
    engine, outs, drafts = engine_drafts(target_dir, drafter_dir, prompt_ids, BUDGETS)
    ref_tokens, ref_drafts = reference_drafts(target_dir, drafter_dir, prompt_ids, BUDGETS)
    assert [o.token_ids for o in outs] == ref_tokens
    assert drafts == ref_drafts
    assert sum(map(len, drafts)) > 10 and engine.stats.draft_tokens_accepted > 0


def test_a_draft_window_drafts_like_the_reference_shown_its_last_rows(pair, prompt_ids):
    """EngineConfig.draft_window on one-row KV blocks: the drafter attends to exactly its last W context
    rows (and its block), as the reference loop shown only those rows does; the tokens stay plain greedy's."""
    target_dir, drafter_dir = pair
    _, outs, drafts = engine_drafts(target_dir, drafter_dir, prompt_ids, BUDGETS, kv_block_size=1, draft_window=24)
    ref_tokens, ref_drafts = reference_drafts(target_dir, drafter_dir, prompt_ids, BUDGETS, window=24)
    assert [o.token_ids for o in outs] == ref_tokens and drafts == ref_drafts
    assert drafts != engine_drafts(target_dir, drafter_dir, prompt_ids, BUDGETS, kv_block_size=1)[2]  # it bites


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (triton backend, CUDA graphs)")
def test_gpu_a_draft_window_under_graphs_changes_drafts_not_tokens(pair, prompt_ids):
    """The window's table gather and key counts are captured in the draft graph: fp32 on the triton backend,
    the tokens are those without a window (the target verifies everything) and the drafts differ."""
    target_dir, drafter_dir = pair
    cfg = dict(device="cuda", backend="triton", dtype="float32", kv_block_size=16)
    _, outs, drafts = engine_drafts(target_dir, drafter_dir, prompt_ids, BUDGETS, draft_window=16, **cfg)
    engine, full_outs, full_drafts = engine_drafts(target_dir, drafter_dir, prompt_ids, BUDGETS, **cfg)
    assert [o.token_ids for o in outs] == [o.token_ids for o in full_outs] and drafts != full_drafts
    assert engine.runner.graphs.captured


def test_last_keys_reads_whole_blocks_from_the_one_holding_the_first_key_kept():
    from engine.models.layers import AttnMeta, last_keys

    tables = torch.tensor([[5, 6, 7, 8], [9, 10, 0, 0]], dtype=torch.int32)
    meta = AttnMeta(torch.tensor([3, 4]), tables, torch.tensor([40, 10], dtype=torch.int32), torch.tensor([0, 1, 2]), 1)
    kept = last_keys(meta, 20, 16)  # 40 keys: from block 1 (key 16) on, 24 of them; 10 keys: all
    assert kept.block_tables.tolist() == [[6, 7, 8, 8], [9, 10, 0, 0]] and kept.seq_lens.tolist() == [24, 10]
    assert kept.slot_mapping is meta.slot_mapping and meta.seq_lens.tolist() == [40, 10]  # nothing moved


@pytest.mark.parametrize("max_batch", [0, 3], ids=["speculating", "gated-then-speculating"])
def test_context_kv_equals_hf_features_after_every_step(pair, prompt_ids, max_batch):
    target_dir, drafter_dir = pair
    engine = Engine(
        EngineConfig(model=str(target_dir), draft_model=str(drafter_dir), device="cpu", levers={"max_batch": max_batch})
    )
    hf = HFQwen3.from_pretrained(str(target_dir), dtype=torch.float32).eval()
    for ids, budget in zip(prompt_ids, BUDGETS, strict=True):
        engine.add_request(ids, SamplingParams(temperature=0, max_tokens=budget, ignore_eos=True))
    checked = 0
    while engine.has_unfinished():
        engine.step()
        checked += check_draft_kv(engine, hf)
    assert checked > 20
    assert engine.stats.rounds > engine.stats.gated_rounds > 0 if max_batch else engine.stats.gated_rounds == 0
