"""A request's named transitions: the only code that changes its state (engine/request.py)."""

from __future__ import annotations

import torch

from engine.config import SamplingParams
from engine.request import Finish, Request, Status


def _req(prompt=(5, 6, 7), max_tokens=8, stop=frozenset()) -> Request:
    return Request(0, list(prompt), SamplingParams(temperature=0, max_tokens=max_tokens), stop)


def test_prefill_then_rounds_keep_the_drafter_context_level_with_the_kv():
    r = _req()
    r.admitted(3, [1, 2])
    assert (r.status, r.slot, r.blocks) == (Status.RUNNING, 3, [1, 2])
    r.prefilled(9, context_stored=True)
    assert (r.num_kv, r.draft_kv_len, r.draft_ready, r.output_ids) == (3, 3, True, [9])
    assert r.advanced([1, 2], 4, keep_context=True) == 3  # two drafts accepted plus the bonus
    assert (r.num_kv, r.draft_context_len, r.current_token) == (6, 6, 4)
    assert r.advanced([], 8, keep_context=True) == 1  # a gated round keeps the capture
    assert (r.num_kv, r.draft_context_len, r.draft_ready) == (7, 7, True)


def test_a_winning_chain_hands_over_its_rows_until_the_next_draft():
    r = _req()
    r.prefilled(9, context_stored=True)
    r.advanced([1, 2], 4, keep_context=True)
    rows = torch.zeros(3, 4)
    r.context_pending(rows)  # the winner's rows replace the main span's [current, d1, d2]
    assert (r.draft_kv_len, r.draft_context_len) == (3, 6)
    r.context_flushed()
    assert (r.draft_kv_len, r.ctx_pending) == (6, [])


def test_plain_decode_drops_the_drafter_state():
    r = _req()
    r.prefilled(9, context_stored=True)
    r.advanced([], 1, keep_context=False)
    assert (r.num_kv, r.draft_ready, r.draft_context_len) == (4, False, 0)


def test_a_stop_token_inside_the_accepted_run_ends_the_request_there():
    r = _req(stop=frozenset({2}))
    r.prefilled(9, context_stored=True)
    assert r.advanced([1, 2, 3], 4, keep_context=True) == 2
    assert r.output_ids == [9, 1, 2] and r.finish_reason is Finish.STOP
    assert r.num_kv == 3 and r.draft_context_len == 0  # finished: nothing advanced, drafter state released


def test_the_budget_ends_the_request_and_release_gives_back_slot_and_blocks():
    r = _req(max_tokens=3)
    r.admitted(1, [4, 5])
    r.prefilled(9, context_stored=False)
    assert r.advanced([1, 2], 3, keep_context=True) == 2
    assert r.output_ids == [9, 1, 2] and r.finish_reason is Finish.LENGTH
    assert r.released() == (1, [4, 5]) and (r.slot, r.blocks) == (-1, [])
