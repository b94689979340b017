"""Block manager invariants and no leak after requests finish."""

from __future__ import annotations

import pytest

from engine import Engine, EngineConfig, SamplingParams
from engine.kv_cache import NULL_BLOCK, BlockManager


def test_allocate_free_reuse():
    bm = BlockManager(num_blocks=9, block_size=4)
    assert bm.capacity == 8 and bm.num_free == 8
    a = bm.allocate(3)
    b = bm.allocate(5)
    assert NULL_BLOCK not in a + b and len(set(a + b)) == 8 and bm.num_free == 0
    assert not bm.can_allocate(1)
    with pytest.raises(RuntimeError):
        bm.allocate(1)
    bm.free(a)
    assert bm.num_free == 3 and bm.can_allocate(3)
    c = bm.allocate(3)
    assert sorted(c) == sorted(a)
    with pytest.raises(RuntimeError, match="freed twice"):
        bm.free(a[:1] + a[:1])
    bm.free(b)
    assert bm.blocks_for(0) == 0 and bm.blocks_for(4) == 1 and bm.blocks_for(5) == 2


def test_null_block_is_reserved():
    with pytest.raises(ValueError):
        BlockManager(num_blocks=1, block_size=16)


def test_no_leak_after_every_request_finishes(tiny_target):
    engine = Engine(
        EngineConfig(model=str(tiny_target), device="cpu", max_num_seqs=2, num_kv_blocks=12, kv_block_size=4)
    )
    free_before = engine.blocks.num_free
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [3, 3], [9] * 13, [4, 5]]
    outs = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert all(o.finish_reason == "length" for o in outs)
    assert engine.blocks.num_free == free_before
    assert not engine.scheduler.running and not engine.scheduler.waiting
    assert sorted(engine.scheduler._free_slots) == [0, 1]


@pytest.mark.parametrize("reserve", [False, True], ids=["on-prompt", "reserve-budget"])
def test_admission_waits_for_capacity_instead_of_failing(tiny_target, reserve):
    # 11 usable blocks of 4 rows. On the prompt each request takes ceil(9 / 4) = 3 (all three fit;
    # growing to ceil((9 + 8) / 4) = 5 each later preempts); reserving the budget takes 5 -> two at a time.
    engine = Engine(
        EngineConfig(model=str(tiny_target), device="cpu", max_num_seqs=4, num_kv_blocks=12, kv_block_size=4)
    )
    engine.scheduler.reserve_budget = reserve
    for _ in range(3):
        engine.add_request([1] * 9, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    engine.step()
    assert len(engine.scheduler.running) == (2 if reserve else 3)
    outs = []
    while engine.has_unfinished():
        outs += [o for o in engine.step() if o.finished]
    assert [len(o.token_ids) for o in outs] == [8, 8, 8] and len({tuple(o.token_ids) for o in outs}) == 1
    assert (engine.preemptions == 0) == reserve
    assert engine.blocks.num_free == engine.blocks.capacity
