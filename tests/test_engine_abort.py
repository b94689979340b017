"""Engine.abort: a waiting or running request finishes as "abort" and gives back its KV and slot."""

from __future__ import annotations

import pytest

from engine import Engine, EngineConfig, SamplingParams


@pytest.fixture(scope="module")
def engine(tiny_target, tiny_drafter, one_thread):
    return Engine(EngineConfig(model=str(tiny_target), draft_model=str(tiny_drafter), device="cpu", max_num_seqs=1))


def test_abort_running_and_waiting_requests_frees_everything(engine):
    free = engine.blocks.num_free
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    running, waiting = engine.add_request([5, 6, 7, 8], params), engine.add_request([9, 10, 11], params)
    engine.step()  # max_num_seqs=1: the first is admitted and prefilled, the second waits
    engine.step()
    engine.abort(waiting)
    engine.abort(running)
    assert engine.blocks.num_free == free and not engine.scheduler.running and not engine.scheduler.waiting
    reported = {o.request_id: o for o in engine.step()}
    assert {reported[running].finish_reason, reported[waiting].finish_reason} == {"abort"}
    assert 0 < len(reported[running].token_ids) < 40 and reported[waiting].token_ids == []
    assert not engine.has_unfinished()
    (after,) = engine.generate([[5, 6, 7, 8]], params)  # the freed slot and blocks serve again
    assert len(after.token_ids) == 40


def test_abort_of_an_unknown_or_finished_request_is_a_no_op(engine):
    (done,) = engine.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    engine.abort(done.request_id)
    engine.abort("req-does-not-exist")
    assert not engine.has_unfinished() and engine.step() == []
