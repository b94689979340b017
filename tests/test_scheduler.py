"""The plan decision (a pure function) and admission."""

from __future__ import annotations

import pytest

from engine.config import SamplingParams
from engine.kv_cache import BlockManager
from engine.request import Request
from engine.scheduler import Decision, Fallback, Plan, Scheduler, decide_plan


@pytest.mark.parametrize(
    ("active", "drafter", "ready", "max_batch", "expected"),
    [
        (4, False, False, 0, Decision(Plan.DECODE)),
        (4, False, True, 2, Decision(Plan.DECODE)),  # no drafter: knobs have no effect
        (4, True, False, 0, Decision(Plan.DECODE, Fallback.NOT_READY)),
        (4, True, False, 2, Decision(Plan.DECODE, Fallback.NOT_READY)),  # not-ready wins over the gate
        (4, True, True, 0, Decision(Plan.SPECULATIVE)),  # gate off: never gated
        (64, True, True, 0, Decision(Plan.SPECULATIVE)),
        (2, True, True, 3, Decision(Plan.SPECULATIVE)),  # below the threshold: speculate
        (3, True, True, 3, Decision(Plan.GATED, Fallback.GATED)),  # at it: gated round
        (4, True, True, 3, Decision(Plan.GATED, Fallback.GATED)),  # above it: gated round
        (1, True, True, 1, Decision(Plan.GATED, Fallback.GATED)),  # MAX_BATCH=1 gates every round
        (1, True, True, 2, Decision(Plan.SPECULATIVE)),
    ],
)
def test_plan_truth_table(active, drafter, ready, max_batch, expected):
    assert decide_plan(active, drafter, ready, max_batch) == expected


def test_no_active_request_is_an_error():
    with pytest.raises(ValueError):
        decide_plan(0, True, True, 0)


def _req(i: int, prompt_len: int, max_tokens: int) -> Request:
    return Request(i, [1] * prompt_len, SamplingParams(max_tokens=max_tokens), frozenset())


def _scheduler(num_blocks=9, block_size=4, max_num_seqs=4, tokens=64, headroom=0, drafter=False, max_batch=0):
    return Scheduler(BlockManager(num_blocks, block_size), max_num_seqs, tokens, headroom, drafter, max_batch)


def test_prefill_first_then_decode_plan():
    s = _scheduler()
    a = _req(0, 4, 4)
    s.add(a)
    step = s.schedule()
    assert step.decision.plan is Plan.PREFILL and step.requests == [a]
    a.output_ids.append(7)
    s.add(_req(1, 4, 4))
    assert s.schedule().decision.plan is Plan.PREFILL  # a pending prompt takes priority
    s.running[1].output_ids.append(8)
    step = s.schedule()
    assert step.decision == Decision(Plan.DECODE) and len(step.requests) == 2


def test_admission_by_kv_capacity_is_fifo_and_reserves_headroom():
    s = _scheduler(num_blocks=9, block_size=4, headroom=4)  # 8 usable blocks
    big, small = _req(0, 10, 10), _req(1, 1, 1)  # (10 + 10 + 4) / 4 = 6 blocks; (1 + 1 + 4) / 4 = 2
    s.add(big)
    s.add(_req(2, 10, 10))
    s.add(small)
    step = s.schedule()
    assert step.requests == [big] and len(big.blocks) == 6
    assert list(s.waiting)[0].index == 2  # head-of-line waits: no overtaking by the small one
    s.release(big)
    assert s.blocks.num_free == 8 and big.slot == -1


def test_token_budget_splits_prefills():
    s = _scheduler(num_blocks=40, tokens=8)
    for i in range(3):
        s.add(_req(i, 5, 2))
    assert len(s.schedule().requests) == 1
    assert len(s.schedule().requests) == 1


def test_max_num_seqs_limits_admission():
    s = _scheduler(num_blocks=40, max_num_seqs=2)
    for i in range(3):
        s.add(_req(i, 2, 2))
    assert len(s.schedule().requests) == 2
    for r in s.running:
        r.output_ids.append(1)
    assert s.schedule().decision.plan is Plan.DECODE and len(s.waiting) == 1


def test_gate_and_not_ready_from_request_state():
    s = _scheduler(num_blocks=40, drafter=True, max_batch=3)
    for i in range(3):
        s.add(_req(i, 2, 8))
    s.schedule()
    for r in s.running:
        r.output_ids.append(1)
        r.draft_ready = True
    assert s.schedule().decision == Decision(Plan.GATED, Fallback.GATED)
    s.release(s.running[0])
    assert s.schedule().decision == Decision(Plan.SPECULATIVE)
    s.running[0].draft_ready = False
    assert s.schedule().decision == Decision(Plan.DECODE, Fallback.NOT_READY)
