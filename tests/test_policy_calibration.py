"""The adaptive policy's calibration at engine start (shipped tiny pair, CPU, eager timing): a complete
table the policy takes, measured without touching request state, cached per key under PEGASPEC_CACHE,
read back on the next start, measured again when the cache file is unusable."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.policy import calibration as cal
from engine.policy import warmup
from engine.policy.costs import CostTable
from engine.policy.span import policy_spans
from tests.policy_tables import table as policy_table

PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13]]
SEQS = 2  # calibrated batches 1 and 2: a short calibration


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PEGASPEC_CACHE", str(tmp_path))
    return tmp_path


def start(pair, policy: str = "adaptive", drafter: bool = True) -> Engine:
    target, draft = pair
    return Engine(
        EngineConfig(
            model=str(target),
            draft_model=str(draft) if drafter else None,
            device="cpu",
            max_num_seqs=SEQS,
            max_model_len=256,
            levers={"policy": policy},
        )
    )


def cache_files(root) -> list:
    return sorted((root / "costs").glob("*.json"))


def test_calibration_gives_a_complete_table_and_leaves_the_engine_idle(shipped_tiny, cache, one_thread):
    engine = start(shipped_tiny)
    table = engine.rounds.policy.table
    per_round = engine.drafts_per_round
    assert table.spans() == policy_spans(per_round) and {1, 1 + per_round} <= set(table.spans())
    assert sorted(table.draft) == [1, 2] and sorted({b for b, _ in table.verify}) == [1, 2]
    assert all(ms > 0 for ms in [*table.verify.values(), *table.draft.values()])
    assert engine.rounds.policy.decide(2) in {0, *(s - 1 for s in table.spans())}
    # No request state changed: every slot and block free, no request or counter left behind.
    assert not engine.scheduler.has_work() and engine.scheduler.num_free_slots == SEQS
    assert engine.blocks.num_free == engine.blocks.capacity and engine.stats.rounds == 0
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    outs = engine.generate(PROMPTS, params)
    assert [o.request_id for o in outs] == ["req-0", "req-1"]
    static = start(shipped_tiny, "static").generate(PROMPTS, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in static]
    saved = json.loads(cache_files(cache)[0].read_text())
    assert saved["key"]["spans"] == table.spans() and saved["wall_s"] > 0


def test_a_second_start_reads_the_cache(shipped_tiny, cache, one_thread, monkeypatch, caplog):
    first = start(shipped_tiny).rounds.policy.table
    monkeypatch.setattr(cal, "time_forwards", lambda *a, **k: pytest.fail("calibrated again on a cache hit"))
    with caplog.at_level(logging.INFO, logger="engine.policy.calibration"):
        second = start(shipped_tiny).rounds.policy.table
    assert second.verify == first.verify and second.draft == first.draft
    assert "cost table: cache hit" in caplog.text and len(cache_files(cache)) == 1


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        json.dumps({"key": {"device": "another"}, "rows": []}),
        json.dumps({"rows": [{"kind": "verify", "batch": 1, "span": 1, "ms": 1.0}]}),
    ],
    ids=["garbled", "other-key", "no-key"],
)
def test_an_unusable_cache_file_is_measured_again_with_a_warning(shipped_tiny, cache, one_thread, caplog, content):
    start(shipped_tiny)
    (path,) = cache_files(cache)
    path.write_text(content)
    with caplog.at_level(logging.INFO, logger="engine.policy.calibration"):
        engine = start(shipped_tiny)
    assert "unreadable" in caplog.text and "calibrating again" in caplog.text and "calibrated" in caplog.text
    assert engine.rounds.policy is not None
    assert cal.read_cached(path, json.loads(path.read_text())["key"]) is not None  # rewritten whole


def test_switching_a_busy_engine_to_adaptive_is_refused_and_changes_nothing(shipped_tiny, cache, one_thread):
    engine = start(shipped_tiny, "static")
    engine.add_request(PROMPTS[0], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    before = engine.levers
    with pytest.raises(RuntimeError, match="calibration needs an idle engine"):
        engine.set_levers(policy="adaptive")
    assert engine.levers == before and engine.rounds.policy is None and not cache_files(cache)


def test_switching_an_idle_engine_to_adaptive_calibrates_once(shipped_tiny, cache, one_thread, monkeypatch):
    engine = start(shipped_tiny, "static")
    assert engine.rounds.cost_table is None
    engine.set_levers(policy="adaptive")
    assert engine.rounds.policy is not None and len(cache_files(cache)) == 1
    monkeypatch.setattr("engine.engine.calibrated_table", lambda *a: pytest.fail("measured again"))
    engine.set_levers(policy="static")
    engine.set_levers(policy="adaptive")  # the engine keeps its table


def test_every_adaptive_set_levers_asks_for_the_policy_graphs(shipped_tiny, cache, monkeypatch):
    """The engine asks on every switch to the policy, busy or not; capture_policy_graphs captures once,
    on an idle engine (tests/test_policy_graphs.py)."""
    asked = []
    monkeypatch.setattr("engine.engine.capture_policy_graphs", lambda engine, accept: asked.append(engine) or 0)
    engine = start(shipped_tiny, "static")
    spans = range(1, 2 + engine.drafts_per_round)
    engine.set_cost_table(policy_table(lambda b, s: 10.0 + s, lambda b: 1.0, spans, batches=(1, 2)))
    assert asked == []
    engine.add_request(PROMPTS[0], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    engine.set_levers(policy="adaptive")  # busy: the policy is in force at once
    assert engine.rounds.policy is not None and asked == [engine]
    engine.set_levers(policy="static")
    assert asked == [engine]
    start(shipped_tiny, drafter=False)  # no drafter: no policy, nothing to capture
    assert asked == [engine]


def test_a_plain_engine_needs_no_table(shipped_tiny, cache):
    engine = start(shipped_tiny, drafter=False)
    assert engine.levers.policy == "adaptive" and engine.rounds.policy is None and not cache_files(cache)


def test_the_cache_key_names_what_the_costs_depend_on(shipped_tiny, cache, one_thread):
    engine = start(shipped_tiny, "static")
    key = cal.cache_key(engine, warmup.plan_calibration(engine))
    assert key["device"].startswith("cpu:") and key["buckets"] == engine.runner.graphs.buckets
    assert key["target"]["hidden_size"] == engine.target_cfg.geometry.hidden_size
    assert key["drafter"]["block_size"] == engine.draft_cfg.block_size and key["torch"]
    assert key["batches"] == [1, 2] and key["context"] == warmup.CONTEXT
    other = cal.cache_key(engine, warmup.plan_calibration(engine, context=warmup.CONTEXT + 1))
    assert cal.cache_path(other) != cal.cache_path(key) and cal.cache_path(key).parent == cache / "costs"


def test_a_given_table_is_taken_and_one_the_policy_cannot_use_is_refused(shipped_tiny, cache):
    engine = start(shipped_tiny, "static")
    no_drafter = CostTable.from_rows([{"kind": "verify", "batch": 1, "span": 1, "ms": 1.0}])
    with pytest.raises(ValueError, match="drafter rows"):
        engine.set_cost_table(no_drafter)
    assert engine.rounds.cost_table is None
    spans = range(1, 2 + engine.drafts_per_round)
    given = policy_table(lambda b, s: 10.0 + s, lambda b: 1.0, spans, batches=(1, 2))
    engine.set_cost_table(given)
    engine.set_levers(policy="adaptive")
    assert engine.rounds.policy.table is given and not cache_files(cache)  # no calibration


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_the_gpu_the_calibration_captures_the_graphs_the_rounds_replay(shipped_tiny, cache):
    target, draft = shipped_tiny
    config = dict(model=str(target), draft_model=str(draft), device="cuda", max_num_seqs=8, max_model_len=256)
    engine = Engine(EngineConfig(**config, levers={"policy": "adaptive"}))
    table, accept = engine.rounds.policy.table, engine.rounds.accept
    assert sorted(table.draft) == [1, 2, 4, 8] and table.spans() == policy_spans(engine.drafts_per_round)
    captured = set(engine.runner.graphs.captured)
    assert {("verify", s - 1, accept, b) for s in table.spans() for b in (1, 2, 4, 8)} <= captured
    heads = [s - 1 for s in table.spans() if s > 1]  # the drafter with its head over each verified K
    assert {("draft", (), k, b) for k in heads for b in (1, 2, 4, 8)} <= captured
    assert {(b, k) for b in (1, 2, 4, 8) for k in heads if k < engine.drafts_per_round} == set(table.heads)
    assert not engine.scheduler.has_work() and engine.blocks.num_free == engine.blocks.capacity
    outs = engine.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    assert [len(o.token_ids) for o in outs] == [12, 12]
    again = Engine(EngineConfig(**config, levers={"policy": "adaptive"}))
    assert again.rounds.policy.table.verify == table.verify  # read from the cache
    # ...and still every graph its rounds replay captured before it serves: the gated round's decode
    # graph, the drafter and every span the policy chooses, at every bucket (here 1, 2, 4, 8)
    captured, buckets = set(again.runner.graphs.captured), again.runner.graphs.buckets
    decode = {("decode", w, b) for w in again.runner.decode_widths for b in buckets}
    assert decode | {("draft", (), k, b) for k in heads for b in buckets} <= captured
    verify = {("verify", s - 1, again.rounds.accept, b) for s in table.spans() if s > 1 for b in buckets}
    assert verify <= captured  # keyed on the new engine's accept rule (one object per engine)
    assert not again.scheduler.has_work() and again.blocks.num_free == again.blocks.capacity
