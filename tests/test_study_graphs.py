"""Capturing the sweep's graphs before it (engine/bench/study/graphs.py): which graphs the arms need,
every one visited at every batch on a real engine (graphs stood in by an eager recorder on the CPU),
and the count of graphs each sweep run captured."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from engine import Engine, EngineConfig
from engine.bench.arms import parse_arms
from engine.bench.study.graphs import CaptureLog, capture_graphs, graph_keys, tag_rows
from engine.bench.study.run import study_spans
from engine.fixture.known.target import known_pair
from engine.graphs import StepGraphs, _pad


def test_the_arms_name_the_verify_spans_and_whether_one_token_rounds_run():
    static = parse_arms(["spec", "spec+trim=2", "spec+trim=4", "spec+trim=8", "spec+trim=32"], noise_arm=True)
    assert graph_keys(static, 15) == ([2, 4, 8, 15], False, [])
    assert graph_keys(parse_arms(["spec+gate=32"]), 15) == ([15], True, [])
    adaptive = parse_arms(["spec+trim=4+policy=adaptive"])
    assert graph_keys(adaptive, 15) == ([1, 2, 4], True, [])  # the policy's K up to the trim (K = 0: one token)
    assert graph_keys(parse_arms(["plain"]), 15) == ([], False, [])
    # policy=budget: every uniform K up to the trim and the ragged spans holding its rows, as the engine warms
    assert graph_keys(parse_arms(["spec+trim=4+policy=budget"]), 15) == ([1, 2, 3, 4], True, [2, 3, 5])
    assert graph_keys(parse_arms(["spec+policy=budget"]), 15) == (list(range(1, 16)), True, [2, 3, 5, 9, 16])


def test_the_profile_times_the_budget_arms_ragged_spans_whatever_its_budget():
    """policy=budget verifies ragged rows at the ragged spans' row buckets: the cost profile times them (and
    the uniform spans of every arm) before any time budget cuts; the adaptive policy's own spans stay optional."""
    budget = parse_arms(["spec+trim=4", "spec+policy=budget"])
    assert study_spans(budget, 15, needed=True) == [1, 2, 3, 5, 9, 16] == study_spans(budget, 15)
    adaptive = parse_arms(["spec+trim=4", "spec+policy=adaptive"])
    assert study_spans(adaptive, 15, needed=True) == [1, 5, 16] and study_spans(adaptive, 15) == [1, 2, 3, 5, 9, 16]


class EagerGraphs(StepGraphs):
    """StepGraphs on the CPU: every (key, bucket) run eagerly on padded inputs, its first run counted
    as the capture a GPU would make."""

    def __init__(self, buckets: list[int]):
        self.enabled, self.buckets, self.captured, self.captures, self._pool = True, buckets, {}, 0, None
        self.frozen = False

    def run(self, key, fn, n, values, pads, shared=frozenset()):
        bucket = self.bucket(n)
        values = {k: v if k in shared or v.shape[0] == bucket else _pad(v, bucket, pads[k]) for k, v in values.items()}
        if (*key, bucket) not in self.captured:
            self.captured[(*key, bucket)] = True
            self.captures += 1
        return fn(**values)


@pytest.fixture()
def engine(one_thread):
    target, drafter = known_pair("tiny", torch.device("cpu"), torch.float32, seed=0)
    cfg = EngineConfig(model=target, draft_model=drafter, device="cpu", max_num_seqs=4, max_model_len=64, trace=False)
    engine = Engine(cfg)
    engine.runner.graphs = EagerGraphs([1, 2, 3, 4])
    return engine


def test_every_verify_span_the_drafter_and_the_one_token_step_are_captured_at_every_batch(engine):
    got = capture_graphs(engine, [1, 2], True, [1, 2, 3, 4], context=6, budget_s=None)
    accept = engine.rounds.accept
    widths = engine.runner.decode_widths
    kinds = (
        ("verify", 1, accept),
        ("verify", 2, accept),
        ("draft", (), 1),
        ("draft", (), 2),
        *(("decode", w) for w in widths),
    )
    want = {(kind, b) for kind in kinds for b in (1, 2, 3, 4)}
    keys = {(key[:-1], key[-1]) for key in engine.runner.graphs.captured}
    assert want <= keys and got == len(keys) >= 20
    assert not engine.has_unfinished()  # the requests ran out their tokens: the sweep starts idle
    assert capture_graphs(engine, [1, 2], True, [1, 2, 3, 4], context=6, budget_s=None) == 0  # all there


def test_the_budget_arms_ragged_verify_is_captured_at_every_batch_but_one(engine):
    """As the engine's warm-up for policy=budget: per ragged span S at each batch b > 1 a verify of b * S
    rows (one request a row short, so the spans are ragged), keyed by its row bucket."""
    per_round = engine.drafts_per_round
    ks, one_token, ragged = graph_keys(parse_arms(["spec+policy=budget"]), per_round)
    assert capture_graphs(engine, ks, one_token, [1, 2, 3, 4], 6, None, ragged) > 0
    got = {(key[1], key[-1]) for key in engine.runner.graphs.captured if key[0] == "ragged"}
    assert got == {(b * s, b) for s in ragged for b in (2, 3, 4)} and ragged == [2, 3, 5, per_round + 1]


def test_an_exhausted_budget_leaves_the_rest_to_the_sweep(engine):
    assert capture_graphs(engine, [2], False, [1, 2, 3, 4], context=6, budget_s=0.0) >= 0
    assert not any(key[0] == "verify" and key[1] == 2 for key in engine.runner.graphs.captured)
    assert not engine.has_unfinished()


def fake_engine(captures: int) -> SimpleNamespace:
    return SimpleNamespace(runner=SimpleNamespace(graphs=SimpleNamespace(captures=captures)))


def test_the_capture_log_gives_each_measured_row_its_runs_captures():
    engines = {"plain": fake_engine(0), "spec": fake_engine(10)}
    seen = []
    log = CaptureLog(engines, seen.append)
    for arm, captured in (("plain", 1), ("spec", 3), ("plain", 0), ("spec", 2)):  # warm-up round, then round 1
        log.before_arm(arm)
        engines[arm].runner.graphs.captures += captured
    assert seen == ["plain", "spec", "plain", "spec"] and log.runs() == [1, 3, 0, 2]
    rows = [{"arm": "plain"}, {"arm": "spec"}]
    tag_rows(rows, log.runs(), warmup_runs=2)
    assert [r["graph_captures"] for r in rows] == [0, 2]
    fresh = [{"arm": "plain"}]
    tag_rows(fresh, log.runs(), warmup_runs=2)  # runs and rows disagree: left untagged, logged
    assert "graph_captures" not in fresh[0]
