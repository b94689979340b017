"""The plan decision (a pure function) and admission."""

from __future__ import annotations

import pytest

from engine.config import SamplingParams
from engine.kv_cache import BlockManager
from engine.levers import Levers
from engine.request import Request
from engine.scheduler import Plan, Scheduler, decide_plan


@pytest.mark.parametrize(
    ("active", "drafter", "ready", "max_batch", "expected"),
    [
        (4, False, False, 0, Plan.DECODE),
        (4, False, True, 2, Plan.DECODE),  # no drafter: knobs have no effect
        (4, True, False, 0, Plan.DECODE),
        (4, True, False, 2, Plan.DECODE),  # not-ready wins over the gate
        (4, True, True, 0, Plan.SPECULATIVE),  # gate off: never gated
        (64, True, True, 0, Plan.SPECULATIVE),
        (2, True, True, 3, Plan.SPECULATIVE),  # below the threshold: speculate
        (3, True, True, 3, Plan.GATED),  # at it: gated round
        (4, True, True, 3, Plan.GATED),  # above it: gated round
        (1, True, True, 1, Plan.GATED),  # MAX_BATCH=1 gates every round
        (1, True, True, 2, Plan.SPECULATIVE),
    ],
)
def test_plan_truth_table(active, drafter, ready, max_batch, expected):
    assert decide_plan(active, drafter, ready, max_batch) == expected


def test_no_active_request_is_an_error():
    with pytest.raises(ValueError):
        decide_plan(0, True, True, 0)


def _req(i: int, prompt_len: int, max_tokens: int) -> Request:
    return Request(i, [1] * prompt_len, SamplingParams(temperature=0, max_tokens=max_tokens), frozenset())


def _scheduler(num_blocks=9, block_size=4, max_num_seqs=4, tokens=64, headroom=0, drafter=False, max_batch=0):
    blocks = BlockManager(num_blocks, block_size)
    rows = max(headroom, 1)
    return Scheduler(
        blocks, max_num_seqs, tokens, headroom, drafter, Levers(max_batch=max_batch), 4096, 64, round_rows=rows
    )


def test_prefill_first_then_decode_plan():
    s = _scheduler()
    a = _req(0, 4, 4)
    s.add(a)
    step = s.schedule()
    assert (step.plan, step.reqs) == (Plan.PREFILL, [a])
    a.prefilled(7, context_stored=False)
    s.add(_req(1, 4, 4))
    assert s.schedule().plan is Plan.PREFILL  # a pending prompt takes priority
    s.running[1].prefilled(8, context_stored=False)
    step = s.schedule()
    plan, reqs = step.plan, step.reqs
    assert plan is Plan.DECODE and len(reqs) == 2


def test_reserve_budget_admission_is_fifo_and_reserves_headroom():
    s = _scheduler(num_blocks=9, block_size=4, headroom=4)  # 8 usable blocks
    s.reserve_budget = True
    big, small = _req(0, 10, 10), _req(1, 1, 1)  # (10 + 10 + 4) / 4 = 6 blocks; (1 + 1 + 4) / 4 = 2
    s.add(big)
    s.add(_req(2, 10, 10))
    s.add(small)
    assert s.schedule().reqs == [big] and len(big.blocks) == 6
    assert list(s.waiting)[0].index == 2  # head-of-line waits: no overtaking by the small one
    s.release(big)
    assert s.blocks.num_free == 8 and big.slot == -1


def test_token_budget_splits_prefills():
    s = _scheduler(num_blocks=40, tokens=8)
    for i in range(3):
        s.add(_req(i, 5, 2))
    assert len(s.schedule().reqs) == 1
    assert len(s.schedule().reqs) == 1


def test_max_num_seqs_limits_admission():
    s = _scheduler(num_blocks=40, max_num_seqs=2)
    for i in range(3):
        s.add(_req(i, 2, 2))
    assert len(s.schedule().reqs) == 2
    for r in s.running:
        r.prefilled(1, context_stored=False)
    assert s.schedule().plan is Plan.DECODE and len(s.waiting) == 1
    assert not s.may_admit  # one waits, but every slot runs: the next step cannot be its prefill
    s.release(s.running[0])
    assert s.may_admit
    assert s.schedule().plan is Plan.PREFILL and not s.waiting and not s.may_admit


def test_take_ahead_grows_for_the_row_after_the_next_or_takes_nothing():
    """A step launched ahead writes row num_kv + 1: its blocks are taken now, for all or for none."""
    s = _scheduler(num_blocks=6, block_size=4)  # 5 usable blocks
    a, b = _req(0, 3, 8), _req(1, 4, 8)
    s.add(a)
    s.add(b)
    s.schedule()
    a.prefilled(1, context_stored=False)  # num_kv 3: rows 3 and 4 span a boundary
    b.prefilled(1, context_stored=False)  # num_kv 4: rows 4 and 5 lie in its second block
    assert s.schedule().grown == [b] and [len(a.blocks), len(b.blocks), s.blocks.num_free] == [1, 2, 2]
    assert s.take_ahead([a, b], 1, False) == [a] and [len(a.blocks), len(b.blocks), s.blocks.num_free] == [2, 2, 1]
    assert s.take_ahead([a, b], 1, False) == []  # both hold rows num_kv and num_kv + 1 now
    a.num_kv = b.num_kv = 7  # rows 7 and 8: a third block each, one free
    assert s.take_ahead([a, b], 1, False) is None and [len(a.blocks), len(b.blocks), s.blocks.num_free] == [2, 2, 1]


def test_gate_and_not_ready_from_request_state():
    s = _scheduler(num_blocks=40, drafter=True, max_batch=3)
    for i in range(3):
        s.add(_req(i, 2, 8))
    s.schedule()
    for r in s.running:
        r.prefilled(1, context_stored=True)
    assert s.schedule().plan is Plan.GATED
    s.release(s.running[0])
    assert s.schedule().plan is Plan.SPECULATIVE
    s.running[0].drop_draft_state()
    assert s.schedule().plan is Plan.DECODE
