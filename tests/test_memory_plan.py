"""The KV pool is planned, never hit (SPEC 10): an engine whose memory budget cannot hold one request of
max_model_len is refused at start with the bytes named, before any step; within the budget the pool is
sized from it."""

from __future__ import annotations

import pytest
import torch

from engine import Engine, EngineConfig, memory
from engine.kv_cache import kv_bytes_per_block


def test_a_budget_that_cannot_hold_one_request_of_max_model_len_is_refused(tiny_target, monkeypatch):
    monkeypatch.setattr(memory, "CPU_KV_BUDGET", 4096)  # bytes: a few blocks of the tiny geometry at most
    with pytest.raises(ValueError, match=r"holds \d+ blocks, but one request of max_model_len .* needs \d+ .*GiB"):
        Engine(EngineConfig(model=str(tiny_target), device="cpu"))


def test_within_the_budget_the_pool_is_capped_by_it(tiny_target, monkeypatch, caplog):
    config = EngineConfig(model=str(tiny_target), device="cpu", max_num_seqs=64, max_model_len=256)
    g = Engine(config).target_cfg.geometry
    per_block = kv_bytes_per_block(g.num_layers, config.kv_block_size, g.num_kv_heads, g.head_dim, torch.float32)
    monkeypatch.setattr(memory, "CPU_KV_BUDGET", per_block * 20 + per_block // 2)
    assert Engine(config).blocks.num_blocks == 20 and "KV cache limited to 20 blocks" in caplog.text
