"""The drafter's context rows: packed into the draft step (static shape) or stored eagerly.

A round's committed rows ride in the draft step, padded to `ctx_rows` per request; a request with
more pending rows (its prompt, several gated rounds) is stored eagerly first. Forcing every request
down the eager path (`ctx_rows = 0`) is the reference: drafts and drafter KV must not change.
"""

from __future__ import annotations

import json

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.fixture.paths import shipped_pair, shipped_prompts

BUDGETS = [48, 20, 36]


def prompts() -> list[str]:
    lines = shipped_prompts("tiny").read_text().splitlines()[: len(BUDGETS)]
    return [json.loads(line)["text"] for line in lines]


def run(ctx_rows: int | None, max_batch: int) -> tuple[list, list[list[int]], dict]:
    target, drafter = shipped_pair("tiny")
    engine = Engine(EngineConfig(model=str(target), draft_model=str(drafter), device="cpu", spec_max_batch=max_batch))
    runner = engine.runner
    if ctx_rows is not None:
        runner.ctx_rows = ctx_rows
    drafts, stored, inside = [], {"eager": 0, "packed": 0}, []
    real_draft, real_block, real_store = runner.draft, runner._block_forward, runner.drafter.store_context

    def draft(reqs):
        out = real_draft(reqs)
        drafts.append(out.clone())
        return out

    def block_forward(*args, **kwargs):
        inside.append(True)
        try:
            return real_block(*args, **kwargs)
        finally:
            inside.pop()

    def store(*args):
        stored["packed" if inside else "eager"] += 1
        return real_store(*args)

    runner.draft, runner._block_forward, runner.drafter.store_context = draft, block_forward, store
    for text, budget in zip(prompts(), BUDGETS, strict=True):
        engine.add_request(text, SamplingParams(max_tokens=budget, ignore_eos=True))
    outs, kv_snapshots = [], []
    while engine.has_unfinished():
        outs += engine.step()
        kv_snapshots.append([k.clone() for k, _ in runner.draft_kv])
    return sorted((o.request_id, o.token_ids) for o in outs), drafts, stored | {"kv": kv_snapshots}


@pytest.mark.parametrize("max_batch", [0, 3], ids=["speculating", "gated-then-speculating"])
def test_packed_context_matches_eager_store(max_batch):
    outs, drafts, stored = run(None, max_batch)
    ref_outs, ref_drafts, ref_stored = run(0, max_batch)
    assert stored["packed"] > 0
    assert ref_stored["packed"] == len(ref_drafts)  # an all-padding context (nothing packed)
    assert stored["eager"] > 0  # the prompts (and gated runs) still take the eager path
    assert outs == ref_outs
    assert len(drafts) == len(ref_drafts)
    for mine, ref in zip(drafts, ref_drafts, strict=True):
        assert torch.equal(mine, ref)
    for mine, ref in zip(stored["kv"], ref_stored["kv"], strict=True):
        for a, b in zip(mine, ref, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
