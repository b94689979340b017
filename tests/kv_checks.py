"""Engine KV state against an HF forward over each running request's committed tokens: the target's
K/V rows and the drafter's context K/V (what `store_context` makes of the committed features)."""

from __future__ import annotations

import torch

from engine import Engine
from engine.kv_cache import allocate_kv_cache


def hf_state(hf, tokens: list[int], layer_ids) -> tuple[list, torch.Tensor | None]:
    out = hf(input_ids=torch.tensor([tokens]), use_cache=True, output_hidden_states=True)
    kv = [(layer.keys[0].transpose(0, 1), layer.values[0].transpose(0, 1)) for layer in out.past_key_values.layers]
    # HF hidden_states[i + 1] for each tapped layer i (the final-normed state for the last layer), as
    # the DFlash reference feeds its drafter.
    feats = torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1)[0] if layer_ids else None
    return kv, feats


def _slots(engine: Engine, r, rows: int) -> torch.Tensor:
    bs = engine.runner.block_size
    return torch.tensor([r.blocks[p // bs] * bs + p % bs for p in range(rows)])


def check_kv(engine: Engine, hf, atol: float = 2e-4) -> int:
    """Every running request's committed target KV rows equal HF's; returns requests checked."""
    checked = 0
    for r in engine.scheduler.running:
        if not r.output_ids or r.finished:
            continue
        want, _ = hf_state(hf, (r.prompt_ids + r.output_ids)[: r.num_kv], ())
        slots = _slots(engine, r, r.num_kv)
        for (k_cache, v_cache), (k, v) in zip(engine.runner.kv, want, strict=True):
            torch.testing.assert_close(k_cache.flatten(0, 1)[slots], k, atol=atol, rtol=1e-4)
            torch.testing.assert_close(v_cache.flatten(0, 1)[slots], v, atol=atol, rtol=1e-4)
        checked += 1
    return checked


def check_draft_kv(engine: Engine, hf, atol: float = 2e-4) -> int:
    """Every draft-ready request's drafter context K/V rows [0, draft_kv_len) equal an eager store
    of HF's features of its committed tokens; returns requests checked."""
    runner, drafter = engine.runner, engine.drafter
    checked = 0
    for r in engine.scheduler.running:
        if not r.draft_ready or r.finished or not r.draft_kv_len:
            continue
        rows = r.draft_kv_len
        _, feats = hf_state(hf, (r.prompt_ids + r.output_ids)[:rows], drafter.cfg.target_layer_ids)
        g, bs = drafter.g, runner.block_size
        dev = runner.device
        fresh = allocate_kv_cache(g.num_layers, -(-rows // bs), bs, g.num_kv_heads, g.head_dim, runner.dtype, dev)
        here = torch.arange(rows, device=dev)
        drafter.store_context(feats.to(dev, runner.dtype), here, here, fresh)
        slots = _slots(engine, r, rows).to(dev)
        for (k_cache, v_cache), (k, v) in zip(runner.draft_kv, fresh, strict=True):
            torch.testing.assert_close(k_cache.flatten(0, 1)[slots], k.flatten(0, 1)[:rows], atol=atol, rtol=1e-4)
            torch.testing.assert_close(v_cache.flatten(0, 1)[slots], v.flatten(0, 1)[:rows], atol=atol, rtol=1e-4)
        checked += 1
    return checked
