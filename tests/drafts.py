"""Drafts round by round, from the engine and from the reference loop, one request at a time, for
tests that compare the engine's drafter against the reference semantics (fp32, CPU)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import Qwen3ForCausalLM as HFQwen3

from engine import Engine, EngineConfig, SamplingParams
from engine.fixture.dflash_model import DFlashDraftModel
from engine.fixture.reference import plain_generate, reference_generate


def engine_drafts(target, drafter, prompts: Sequence, budgets: Sequence[int], **cfg):
    """(engine, outputs, every full block of drafts proposed per request in round order)."""
    engine = Engine(EngineConfig(model=str(target), draft_model=str(drafter), **{"device": "cpu", **cfg}))
    seen: dict[str, list[list[int]]] = {}
    real = engine.runner.draft

    def record(reqs, heads=None):
        out = real(reqs, heads)
        for r, row in zip(reqs, out.tolist(), strict=True):
            seen.setdefault(r.id, []).append(row)
        return out

    engine.runner.draft = record
    outs = [
        engine.generate([p], SamplingParams(temperature=0, max_tokens=b, ignore_eos=True))[0]
        for p, b in zip(prompts, budgets, strict=True)
    ]
    return engine, outs, [seen.get(o.request_id, []) for o in outs]


def reference_drafts(target_dir, drafter_dir, prompts: Sequence, budgets: Sequence[int], window: int = 0):
    """(tokens, drafts per round) of the reference loop; its tokens must equal plain greedy. window: the
    drafter is shown only its last `window` context rows (0: all)."""
    target = HFQwen3.from_pretrained(str(target_dir), dtype=torch.float32).eval()
    drafter = DFlashDraftModel.from_pretrained(drafter_dir).eval()
    if window:
        forward = drafter.forward
        drafter.forward = lambda x, ctx, pos, ctx_pos, mask=None: forward(
            x, ctx[:, -window:], pos, ctx_pos[:, -window:]
        )
    tokens, drafts = [], []
    for p, budget in zip(prompts, budgets, strict=True):
        seen: list[list[int]] = []
        propose = drafter.propose

        def record(logits, anchor, seen=seen, propose=propose):
            seen.append(propose(logits, anchor))
            return seen[-1]

        drafter.propose = record
        res = reference_generate(target, drafter, p, budget)
        del drafter.propose
        tokens.append(res.tokens)
        drafts.append(seen)
        assert res.tokens == plain_generate(target, p, budget)
    return tokens, drafts
