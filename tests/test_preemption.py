"""Admission on the prompt, KV taken as tokens are produced, and preemption by recompute.

Greedy outputs under a pool far too small for the batch's budgets equal a roomy run, with plain
decode, speculation and gated rounds, at block boundaries; preempted requests resume on prompt +
committed output; nothing leaks."""

from __future__ import annotations

import pytest

from engine import Engine, EngineConfig, SamplingParams
from engine.config import SamplingParams as SP
from engine.kv_cache import BlockManager
from engine.levers import Levers
from engine.request import Request, Status
from engine.scheduler import Plan, Scheduler
from tests.checkpoints import make_dspark_drafter
from tests.engine_checks import assert_idle

# Block size 4: prompts of 3, 4, 5, 8 and 12 tokens start on, before and after block boundaries.
PROMPTS = [[5, 6, 7, 8], [1, 2, 3], list(range(20, 32)), [7] * 5, [100, 200, 150, 42, 42, 8, 1, 9]]
BUDGETS = [28, 17, 24, 21, 32]
BLOCK = 4


def _params(budgets=BUDGETS) -> list[SamplingParams]:
    return [SamplingParams(temperature=0, max_tokens=b, ignore_eos=True) for b in budgets]


@pytest.fixture(scope="module")
def roomy(tiny_target, one_thread):
    engine = Engine(EngineConfig(model=str(tiny_target), device="cpu", kv_block_size=BLOCK))
    return [o.token_ids for o in engine.generate(PROMPTS, _params())]


def tight(target, drafter=None, blocks=14, **levers) -> Engine:
    """A pool of blocks - 1 usable blocks: room for about one and a half of these requests."""
    cfg = EngineConfig(
        model=str(target),
        draft_model=None if drafter is None else str(drafter),
        device="cpu",
        kv_block_size=BLOCK,
        num_kv_blocks=blocks,
        max_num_seqs=5,
        levers=levers,
    )
    return Engine(cfg)


def test_plain_decode_under_pressure_equals_a_roomy_run(tiny_target, roomy):
    engine = tight(tiny_target)
    outs = engine.generate(PROMPTS, _params())
    assert [o.token_ids for o in outs] == roomy
    assert engine.preemptions > 0
    assert_idle(engine)


@pytest.mark.parametrize("levers", [{}, {"max_drafts": 3}, {"max_batch": 2}], ids=["spec", "trim", "gated"])
def test_speculation_under_pressure_equals_a_roomy_run(tiny_target, tiny_drafter, roomy, levers):
    engine = tight(tiny_target, tiny_drafter, blocks=16, **levers)
    outs = engine.generate(PROMPTS, _params())
    assert [o.token_ids for o in outs] == roomy
    assert engine.preemptions > 0
    if levers.get("max_batch"):
        assert engine.stats.gated_rounds > 0
    assert engine.stats.rounds > engine.stats.gated_rounds  # speculation ran too
    assert_idle(engine)


def test_seeded_sampling_survives_preemption(tiny_target):
    params = [
        SamplingParams(max_tokens=b, temperature=0.9, top_k=40, seed=i, ignore_eos=True) for i, b in enumerate(BUDGETS)
    ]
    roomy = Engine(EngineConfig(model=str(tiny_target), device="cpu", kv_block_size=BLOCK)).generate(PROMPTS, params)
    engine = tight(tiny_target)
    assert [o.token_ids for o in engine.generate(PROMPTS, params)] == [o.token_ids for o in roomy]
    assert engine.preemptions > 0  # a re-prefill samples nothing: the generators stay in step


def test_a_request_that_can_never_fit_is_rejected_up_front(tiny_target):
    engine = tight(tiny_target, blocks=8)  # 7 usable blocks = 28 tokens
    (out,) = engine.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=25))
    assert out.finish_reason == "rejected" and "KV blocks" in out.error
    (out,) = engine.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    assert out.finish_reason == "length" and len(out.token_ids) == 24


# -- the scheduler alone ---------------------------------------------------------------------------------
def _req(i: int, prompt_len: int, max_tokens: int) -> Request:
    return Request(i, [1] * prompt_len, SP(max_tokens=max_tokens), frozenset())


def _scheduler(num_blocks: int, round_rows: int = 1) -> Scheduler:
    return Scheduler(BlockManager(num_blocks, BLOCK), 4, 64, 0, False, Levers(), 4096, 64, round_rows=round_rows)


def test_admission_takes_the_prompts_blocks_and_keeps_a_round_free():
    s = _scheduler(num_blocks=6)  # 5 usable
    a, b, c = _req(0, 8, 100), _req(1, 4, 100), _req(2, 4, 100)
    for r in (a, b, c):
        s.add(r)
    step = s.schedule()
    # a takes 2 blocks (+1 ahead for its next row), b 1 (+1 ahead): c would leave no growth room.
    assert step.plan is Plan.PREFILL and step.reqs == [a, b] and step.grown == [a, b]
    assert len(a.blocks) == 2 and len(b.blocks) == 1 and list(s.waiting) == [c]


def test_growth_preempts_the_youngest_and_requeues_it_at_the_front():
    s = _scheduler(num_blocks=5)  # 4 usable
    a, b, late = _req(0, 4, 100), _req(1, 3, 100), _req(2, 5, 5)
    s.add(a)
    s.add(b)
    s.schedule()
    a.prefilled(9, context_stored=False)
    b.prefilled(9, context_stored=False)
    a.advanced([], 9, keep_context=False)  # a: 5 rows of K/V, writing row 6 next: 2 blocks
    s.add(late)
    step = s.schedule()  # late would take 2 of the 2 free blocks, leaving none for a's next row: it waits
    assert step.plan is Plan.DECODE and step.reqs == [a, b] and step.grown == [a] and list(s.waiting) == [late]
    for r in (a, b):
        for _ in range(4):
            r.advanced([], 9, keep_context=False)
    step = s.schedule()  # a takes the last free block, b needs a 2nd: b (the youngest running) is preempted
    assert step.reqs == [a] and s.preemptions == 1
    assert b.status is Status.WAITING and b.blocks == [] and b.num_kv == 0 and b.slot == -1
    assert list(s.waiting) == [b, late] and len(b.output_ids) == 5
    assert b.prefill_ids == [1] * 3 + [9] * 4  # prompt + output without the current token


def test_hedged_rounds_under_pressure_equal_a_roomy_run(tiny_target, tmp_path, roomy):
    """Hedge chains verify into scratch KV reserved outside the pool: the pool alone runs dry."""
    drafter = tmp_path / "dspark"
    make_dspark_drafter(drafter, layout="deepspec", block_size=5)
    engine = tight(tiny_target, drafter, blocks=16 + 12, hedge=2, hedge_positions=(0, 1))
    assert engine.scheduler.blocks.capacity < 16  # the scratch came out of num_kv_blocks, not the pool
    outs = engine.generate(PROMPTS, _params())
    assert [o.token_ids for o in outs] == roomy
    assert engine.preemptions > 0 and engine.stats.hedge_chains > 0
    assert_idle(engine)
