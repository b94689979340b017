"""Graphs captured before serving (engine/policy/warmup.py `capture_serving_graphs`, `Engine.capture_graphs`):
the one-token step at every table width and the drafter and verify of the round's K at every bucket the
pool admits, every graphed prefill shape, then frozen graphs: a step whose graph is missing runs eagerly and
nothing is captured while serving, with outputs unchanged. On the CPU a stand-in capture replays its static
inputs eagerly."""

from __future__ import annotations

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.prefill import prefill_shapes, staged_buffers
from tests.graph_fakes import CPUGraphs

PROMPTS = [[5, 6, 7, 8, 9, 10], [1, 2, 3], list(range(20, 60)), [7] * 9]
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def engine(target, drafter, **levers) -> Engine:
    cfg = EngineConfig(model=str(target), draft_model=str(drafter), device="cpu", max_num_seqs=4, levers=levers)
    e = Engine(cfg)
    e.runner.graphs = CPUGraphs(e.runner.graphs.buckets)
    e.runner.prefill_staged = staged_buffers(max(e.runner.graphs.buckets), torch.device("cpu"))
    vocab = e.target_cfg.geometry.vocab_size
    e.runner.logits_buffer = lambda rows: torch.empty(rows, vocab)  # the graphed prefill's logits rows
    return e


@pytest.mark.parametrize("levers", [{}, {"max_drafts": 2}])
def test_capture_at_start_then_nothing_captured_while_serving(tiny_target, tiny_drafter, one_thread, levers):
    e = engine(tiny_target, tiny_drafter, **levers)
    report = e.capture_graphs()
    runner, k = e.runner, levers.get("max_drafts", e.drafts_per_round)
    buckets = runner.graphs.buckets  # 1, 2, 4: the pool holds them all
    want = {("decode", w, b) for w in runner.decode_widths for b in buckets}
    want |= {("draft", (), k, b) for b in buckets} | {("verify", k, e.rounds.accept, b) for b in buckets}
    prefills = {("prefill", t, q, m) for t, q, m in prefill_shapes(buckets, e.config.max_num_batched_tokens)}
    assert report["prefill_graphs"] == len(prefills) and prefills <= set(runner.graphs.captured)
    want |= prefills
    assert want <= set(runner.graphs.captured) and report["graphs"] == runner.graphs.captures >= len(want)
    assert report["seconds"] >= 0 and report["bytes"] == 0 and runner.graphs.frozen  # no CUDA pool here
    assert not e.has_unfinished() and e.blocks.num_free == e.blocks.capacity  # the dummies handed back
    captured = dict(runner.graphs.captured)
    outs = e.generate(PROMPTS, GREEDY)
    assert runner.graphs.captured == captured and runner.graphs.eager_misses == 0  # all of it warmed
    fresh = Engine(EngineConfig(model=str(tiny_target), draft_model=str(tiny_drafter), device="cpu", levers=levers))
    assert [o.token_ids for o in outs] == [o.token_ids for o in fresh.generate(PROMPTS, GREEDY)]
    e.set_levers(max_drafts=1)  # a K no graph was captured for: its rounds run eagerly, nothing captured
    again = e.generate(PROMPTS, GREEDY)
    assert runner.graphs.captured == captured and runner.graphs.eager_misses > 0
    assert [o.token_ids for o in again] == [o.token_ids for o in outs]


def test_without_graphs_nothing_is_captured_or_frozen(tiny_target, tiny_drafter, one_thread):
    e = Engine(EngineConfig(model=str(tiny_target), draft_model=str(tiny_drafter), device="cpu"))
    none = {"graphs": 0, "prefill_graphs": 0, "seconds": 0.0, "bytes": 0}
    assert e.capture_graphs() == none and not e.runner.graphs.frozen


def test_a_warm_up_at_long_context_skips_the_table_width_its_keys_overflow(
    tiny_target, tiny_drafter, one_thread, monkeypatch
):
    """Dummies holding more keys than the short table width: the one-token step is warmed at the full
    width alone (the short one would read past its columns: an illegal access on the H200)."""
    from engine.policy.warmup import dummy_requests, warm_graphs

    monkeypatch.setattr("engine.runner.SHORT_KEYS", 128)  # two widths within the tiny pair's 512 tokens
    e = Engine(EngineConfig(model=str(tiny_target), draft_model=str(tiny_drafter), device="cpu"))
    runner = e.runner
    runner.graphs = CPUGraphs(runner.graphs.buckets)
    short, full = runner.decode_widths
    with dummy_requests(e, 2, short * runner.block_size + 10, 2) as reqs:
        warm_graphs(runner, e.rounds.accept, reqs, [1, 2], [])
    assert {key[1] for key in runner.graphs.captured if key[0] == "decode"} == {full}


@pytest.mark.parametrize("max_drafts", [0, 3])
def test_a_budget_server_replays_only_graphs_captured_at_start(tiny_target, tiny_drafter, one_thread, max_drafts):
    """policy=budget: every uniform K, the drafter at each ragged span, the ragged row buckets."""
    from engine.kernels.span_meta import ragged_spans
    from tests.test_policy_budget import linear

    cfg = EngineConfig(
        model=str(tiny_target),
        draft_model=str(tiny_drafter),
        device="cpu",
        max_num_seqs=4,
        levers={"policy": "budget", "max_drafts": max_drafts},
        cost_table=linear(0.3),
    )

    class Recording(CPUGraphs):
        def run(self, key, *args, **kw):
            self.replayed.append(key)
            return super().run(key, *args, **kw)

    e = Engine(cfg)
    e.runner.graphs = Recording(e.runner.graphs.buckets)
    e.runner.graphs.replayed = []
    e.capture_graphs()
    graphs, per_round = e.runner.graphs, e.drafts_per_round
    ragged = {key[1] for key in graphs.captured if key[0] == "ragged"}
    top = max_drafts or per_round
    assert {b * s for b in graphs.buckets[1:] for s in ragged_spans(per_round) if s - 2 < top} <= ragged
    assert {("verify", k, e.rounds.accept, 4) for k in range(1, top + 1)} <= set(graphs.captured)
    captured = dict(graphs.captured)
    outs = e.generate(PROMPTS + [[3, 1, 4, 1, 5]], GREEDY)
    assert graphs.captured == captured and graphs.eager_misses == 0
    assert any(key[0] == "ragged" for key in graphs.replayed), "no ragged round replayed"
    plain = Engine(EngineConfig(model=str(tiny_target), device="cpu"))
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain.generate(PROMPTS + [[3, 1, 4, 1, 5]], GREEDY)]
