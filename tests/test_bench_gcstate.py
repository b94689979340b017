"""The benches' GC policy: a frozen start-up heap for a sweep, and the collections a run paid."""

from __future__ import annotations

import argparse
import gc
import weakref

import pytest
import torch

from engine.bench import sweep
from engine.bench.arms import parse_arms
from engine.bench.closed_loop import LoadResult, closed_loop
from engine.bench.common import make_engine
from engine.bench.gcstate import GcWatch, frozen_heap, settle_heap

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def thawed():
    """A heap nothing froze before the test (a process that ran other code may have; re-frozen after)."""
    was = gc.get_freeze_count()
    gc.unfreeze()
    yield
    if was:
        gc.freeze()


class Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the cyclic collector frees it


def test_frozen_heap_collects_first_freezes_the_survivors_and_thaws_them_after(thawed):
    garbage = Node()
    dead = weakref.ref(garbage)
    del garbage
    assert dead() is not None  # not freed by refcount
    with frozen_heap():
        assert dead() is None  # collected, not frozen as a leak
        assert gc.get_freeze_count() > 0
        with frozen_heap():  # nested: leaves the outer freeze alone
            pass
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0


def test_watch_times_each_collection_by_generation_and_detaches():
    callbacks = list(gc.callbacks)
    with GcWatch() as watch:
        gc.collect(0)
        gc.collect()
        gc.collect()
    gc.collect()  # after exit: not counted
    assert watch.count[0] >= 1 and watch.count[2] == 2
    assert watch.total_ms == sum(watch.ms) and watch.ms[2] > 0
    assert gc.callbacks == callbacks


def test_closed_loop_reports_the_full_collections_its_steps_paid(tiny_target):
    args = argparse.Namespace(dtype="auto", backend="auto", no_cuda_graphs=True)
    engine = make_engine(tiny_target, None, args, torch.device("cpu"), max_num_seqs=2, seq_tokens=8)
    real = engine.step

    def collecting_step():
        gc.collect()
        return real()

    engine.step = collecting_step
    gc.disable()  # only the steps' own collections
    try:
        res = closed_loop(engine, [[1, 2], [3, 4]], concurrency=2, num_requests=2, max_tokens=3)
    finally:
        gc.enable()
    assert res.gc_full == len(res.steps) == 3  # one prefill, two decode steps
    assert 0 < res.gc_ms < res.wall_s * 1e3


def test_the_sweep_runs_every_closed_loop_on_a_frozen_heap(monkeypatch, thawed):
    frozen = []

    def fake_loop(engine, prompts, c, n, new_tokens, first=0):
        frozen.append(gc.get_freeze_count() > 0)
        return LoadResult(wall_s=1.0, requests=n, output_tokens=n * new_tokens, max_in_flight=c, gc_ms=0.5, gc_full=1)

    class Levers:
        rounds = argparse.Namespace(policy=None, overlap=argparse.Namespace(used=0))

        def set_levers(self, **_):
            pass

    monkeypatch.setattr(sweep, "closed_loop", fake_loop)
    arms = parse_arms(["plain", "spec"])
    rows, _ = sweep.run_sweep({"plain": Levers(), "spec": Levers()}, arms, [[1]], [1], 1, 4, progress=False)
    assert frozen and all(frozen) and gc.get_freeze_count() == 0
    assert {(r["gc_ms"], r["gc_full"]) for r in rows} == {(0.5, 1)}


def test_settle_heap_outside_a_frozen_sweep_freezes_nothing(monkeypatch):
    """Checked on the calls, not the process's freeze count: on the H200 suite (Python 3.12, torch
    2.11) something else in a worker froze the whole heap between the fixture's thaw and the check."""
    calls = []
    monkeypatch.setattr(gc, "get_freeze_count", lambda: 0)
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
    settle_heap()
    assert calls == []


def test_settle_heap_freezes_what_earlier_runs_left_inside_a_frozen_sweep(thawed):
    gc.collect()
    records = [[i] for i in range(1000)]  # a sweep's records: alive, tracked, growing
    with frozen_heap():
        frozen = gc.get_freeze_count()
        records += [[i] for i in range(1000)]
        garbage = Node()
        dead = weakref.ref(garbage)
        del garbage
        settle_heap()
        assert dead() is None  # the young garbage is collected, not frozen
        assert gc.get_freeze_count() >= frozen + 1000  # the new records joined the frozen heap
        assert gc.get_count()[0] < 50  # the next run's collections start from an empty young heap
    assert len(records) == 2000
