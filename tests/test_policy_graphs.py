"""The adaptive engine's graph capture before it serves (engine/policy/warmup.py), on a stand-in runner
that records what the capture ran: at every bucket the pool admits the decode graph, then for every
policy span but 1 the drafter with its head over K positions and the verify of K drafts on the
drafter's own buffer; once, on an idle engine; nothing without graphs. On a GPU the real captures are
checked in tests/test_policy_calibration.py."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest

from engine.policy import warmup as policy_graphs
from engine.policy.warmup import CalibrationPlan


class Runner:
    def __init__(self, enabled: bool):
        self.graphs = SimpleNamespace(
            enabled=enabled, buckets=[1, 2, 4, 8, 16, 24, 32], captures=0, policy_captured=False, frozen=False
        )
        self.calls: list[tuple] = []
        self.staged = None
        self.decode_widths = [64, 2560]  # the short and the full block table
        self.block_size = 16  # both widths hold the dummies' 64 keys

    def stage(self, reqs, limits=None):
        self.staged = (len(reqs), tuple(limits) if limits else None)

    def decode(self, reqs, width):
        assert self.staged == (len(reqs), None)
        self._ran(("decode", width, len(reqs)))

    def draft(self, reqs, heads):
        assert self.staged == (len(reqs), None)
        self._ran(("draft", heads, len(reqs)))
        return f"drafts@{len(reqs)}x{heads}"

    def verify(self, reqs, drafts, k, accept):
        assert self.staged == (len(reqs), (k,) * len(reqs)) and drafts == f"drafts@{len(reqs)}x{k}"
        self._ran(("verify", k, accept, len(reqs)))

    def _ran(self, key):
        self.graphs.captures += key not in self.calls
        self.calls.append(key)


@pytest.fixture
def engine(monkeypatch):
    plan = CalibrationPlan(context=64, spans=[1, 2, 3, 5, 9, 16], batches=[1, 2, 4, 8, 16, 20])
    monkeypatch.setattr(policy_graphs, "plan_calibration", lambda engine: plan)

    @contextlib.contextmanager
    def dummies(engine, count, context, budget):
        assert (count, context, budget) == (16, 64, 16)  # the largest bucket the pool admits
        yield [SimpleNamespace(num_kv=context) for _ in range(count)]

    monkeypatch.setattr(policy_graphs, "dummy_requests", dummies)
    busy = SimpleNamespace(has_work=lambda: False)
    return SimpleNamespace(runner=Runner(True), scheduler=busy)


def test_every_bucket_gets_the_decode_the_drafter_and_each_span_but_one(engine):
    assert policy_graphs.capture_policy_graphs(engine, "greedy") == 5 * (2 + 2 * 5)
    per_k = [(("draft", k), ("verify", k, "greedy")) for k in (1, 2, 4, 8, 15)]
    per_bucket = [("decode", 64), ("decode", 2560), *(key for pair in per_k for key in pair)]
    assert engine.runner.calls == [(*key, b) for b in (1, 2, 4, 8, 16) for key in per_bucket]
    assert policy_graphs.capture_policy_graphs(engine, "greedy") == 0 and len(engine.runner.calls) == 60  # once


def test_a_serving_engine_still_captures_the_policy_graphs_and_stays_frozen(engine):
    engine.runner.graphs.frozen = True  # capture_serving_graphs ran: serving steps capture nothing
    seen = []
    engine.runner._ran = lambda key, ran=engine.runner._ran: (seen.append(engine.runner.graphs.frozen), ran(key))
    assert policy_graphs.capture_policy_graphs(engine, "greedy") == 60
    assert not any(seen) and engine.runner.graphs.frozen  # unfrozen while warming, frozen after


def test_a_busy_engine_captures_nothing_until_it_is_idle(engine):
    engine.scheduler.has_work = lambda: True
    assert policy_graphs.capture_policy_graphs(engine, "greedy") == 0 and engine.runner.calls == []
    engine.scheduler.has_work = lambda: False
    assert policy_graphs.capture_policy_graphs(engine, "greedy") == 60


def test_without_graphs_nothing_runs(engine):
    engine.runner = Runner(False)
    assert policy_graphs.capture_policy_graphs(engine, "greedy") == 0 and engine.runner.calls == []
