"""Speculative rounds with the next round launched ahead (engine/decode_overlap.py, ModelRunner.stage_round):
on the shipped tiny pair (a drafter that accepts real runs), every request's tokens, finish reason and
the speculative statistics are those of the step-by-step engine (EngineConfig.decode_overlap=False),
whatever happens between rounds: a request ending mid-batch (budget, stop token, stop string), an
abort, an admission, preemption, a sampled request, the trim, hedging. The rounds launched ahead are
counted, so a test also fails if none was launched or none was used."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from tests.test_decode_overlap import admit_and_abort, run, submit_at


@pytest.fixture(scope="module")
def prompts(shipped_prompt_ids):
    return [ids[:32] for ids in shipped_prompt_ids[:4]]


def make(pair, overlap: bool, **options) -> Engine:
    target, drafter = pair
    cfg = dict(model=str(target), draft_model=str(drafter), device="cpu", max_num_seqs=4) | options
    return Engine(EngineConfig(decode_overlap=overlap, **cfg))


def both(pair, script, batches_may_differ: bool = False, **options) -> tuple[dict, Engine]:
    """batches_may_differ: a prefill may run a round later (the drafter forwards then differ in number)."""
    off_engine = make(pair, False, **options)
    off = run(off_engine, script)
    engine = make(pair, True, **options)
    on = run(engine, script)
    ignored = {"draft_forwards": 0} if batches_may_differ else {}
    assert on == off and replace(engine.stats, **ignored) == replace(off_engine.stats, **ignored)
    return on, engine


def greedy(n: int, **more) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, **more)


def launched_rounds(engine: Engine) -> tuple[int, int]:
    ov = engine.rounds.overlap
    assert ov.launched is None or ov.launched.k  # nothing held but a round that the next step may use
    return ov.launches, ov.used


def test_uneven_budgets_match_and_each_round_after_a_budget_end_is_used(shipped_tiny, prompts, one_thread):
    """No request waits, so a round launches even where the round before it ends a request by its
    budget: the launched round serves the others (their rows moved up in the staged inputs)."""
    lengths = [20, 61, 45, 33]
    script = submit_at({0: [(p, greedy(n)) for p, n in zip(prompts, lengths, strict=True)]})
    out, engine = both(shipped_tiny, script)
    assert sorted(len(t) for t, _, _ in out.values()) == sorted(lengths)
    launches, used = launched_rounds(engine)
    assert used >= 0.8 * launches and used > 5 and engine.stats.draft_tokens_accepted > 0


def test_a_stop_token_and_a_stop_string_end_requests_where_plain_decode_would(shipped_tiny, prompts, one_thread):
    (free,) = run(make(shipped_tiny, False), submit_at({0: [(prompts[0], greedy(40))]})).values()
    tokens = free[0]
    stop_token = SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[tokens[17]], ignore_eos=True)
    engine = make(shipped_tiny, False)
    stop_text = engine.tokenizer.decode(tokens[20:23])
    stop_string = SamplingParams(temperature=0, max_tokens=40, stop=[stop_text], ignore_eos=True)
    batch = [(prompts[0], stop_token), (prompts[0], stop_string), (prompts[1], greedy(48)), (prompts[2], greedy(48))]
    out, engine = both(shipped_tiny, submit_at({0: batch}))
    assert sorted(reason for _, reason, _ in out.values()) == ["length", "length", "stop", "stop"]
    assert launched_rounds(engine)[1] > 0


@pytest.mark.parametrize(("admit_at", "abort_at"), [(3, 6), (4, 4)])
def test_requests_admitted_and_aborted_between_rounds(shipped_tiny, prompts, one_thread, admit_at, abort_at):
    out, engine = both(shipped_tiny, admit_and_abort(40, admit_at, abort_at, prompts))
    assert sorted(reason for _, reason, _ in out.values()) == ["abort", "length", "length"]
    assert launched_rounds(engine)[1] > 0


def test_a_queue_behind_a_full_batch_waits_one_round_for_the_round_launched(shipped_tiny, prompts, one_thread):
    """A round that ends a request while another waits for the slot launched the next round already: that
    round runs for the others before the waiting request's prefill (which waits one round), so no round
    launched is dropped, and the tokens are the round-by-round engine's."""
    lengths = [24, 40, 31, 18]
    seen = []

    def script(engine: Engine, n: int) -> None:
        if n == 0:
            for p, m in zip(prompts, lengths, strict=True):
                engine.add_request(p, greedy(m))
        seen.append((bool(engine.scheduler.waiting), engine.rounds.overlap.holds()))

    out, engine = both(shipped_tiny, script, batches_may_differ=True, max_num_seqs=2)
    assert sorted(len(t) for t, _, _ in out.values()) == sorted(lengths)
    launches, used = launched_rounds(engine)
    assert used == launches > 0 and (True, True) in seen  # a round held while a request waited


def test_preemption_under_a_small_pool(shipped_tiny, prompts, one_thread):
    script = submit_at({0: [(p, greedy(40)) for p in prompts]})
    out, engine = both(shipped_tiny, script, num_kv_blocks=26, kv_block_size=8)
    assert engine.preemptions > 0 and all(len(t) == 40 for t, _, _ in out.values())
    assert launched_rounds(engine)[1] > 0


@pytest.mark.parametrize("levers", [{"max_drafts": 2}, {"max_drafts": 1}, {"max_batch": 3}])
def test_the_trim_and_the_gate(shipped_tiny, prompts, one_thread, levers):
    script = submit_at({0: [(p, greedy(n)) for p, n in zip(prompts, [30, 44, 12, 50], strict=True)]})
    _, engine = both(shipped_tiny, script, levers=levers)
    assert launched_rounds(engine)[1] > 0


def test_a_sampled_request_in_the_batch_runs_round_by_round(shipped_tiny, prompts, one_thread):
    sampled = SamplingParams(max_tokens=30, temperature=0.8, seed=5, ignore_eos=True)
    _, engine = both(shipped_tiny, submit_at({0: [(prompts[0], greedy(30)), (prompts[1], sampled)]}))
    assert launched_rounds(engine) == (0, 0) and engine.stats.rounds > 0


def test_stage_round_stages_what_the_host_would_after_settling(shipped_tiny, prompts, one_thread):
    """The staged inputs of the round after one whose rows are known, staged on the device for the
    requests that remain (index: their rows), equal those the host stages after settling that round."""
    from engine.round import draft_limit, settle

    engine = make(shipped_tiny, False)
    for p, n in zip(prompts[:3], [3, 30, 30], strict=True):
        engine.add_request(p, greedy(n))
    engine.step()  # the prefills
    reqs = [r for group in engine._requests.values() for r in group]
    k, runner = 4, engine.runner
    limits = [draft_limit(k, r.remaining) for r in reqs]
    runner.stage(reqs, limits)
    rows = torch.tensor([[1, 7, 8, 9, 10, 50, 51, 52, 53, 54], [0] + [1] * 4 + [60] * 5, [4] + [3] * 4 + [70] * 5])
    rows[2, 1 + k + 4] = 77
    runner.stage_round(reqs[1:], rows, k, [1, 2])
    device = runner.inputs.buffer[:, :3].clone()
    for r, row, limit in zip(reqs, rows.tolist(), limits, strict=True):
        settle(r, row, k, limit)
    assert reqs[0].finished and not reqs[1].finished  # the first by its budget: 2 of the 2 tokens it had left
    runner.stage(reqs[1:], [draft_limit(k, r.remaining) for r in reqs[1:]])
    host = runner.inputs.buffer[:, :2].clone()
    assert device[:, :2].tolist() == host.tolist() and device[:, 2].tolist() == [0, runner.null_row, 0, 0, 0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (CUDA graphs, pinned copies)")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gpu_graph_replays_launched_ahead_match_round_by_round(shipped_tiny, prompts, dtype):
    """On the triton backend with CUDA graphs: each launched round's inputs are staged on the device from
    the verify graph's accept rows while the host reads the round before; requests ending mid-batch
    move the others up (a smaller bucket's graphs then replay). Batch-invariant kernels: a launched round
    that serves fewer requests than it ran computes their rows as the smaller batch does."""
    from engine.timing import PhaseTimer

    opts = dict(device="cuda", backend="triton", dtype=dtype, max_num_seqs=8, kv_block_size=16, batch_invariant=True)
    lengths = [20, 90, 61, 33, 75, 48]
    script = submit_at({0: [(p, greedy(n)) for p, n in zip(prompts * 2, lengths, strict=False)]})
    _, engine = both(shipped_tiny, script, **opts)
    launches, used = launched_rounds(engine)
    assert engine.runner.graphs.captured and used > 10 and used >= 0.8 * launches
    engine.timer = PhaseTimer(engine.device)
    engine.generate(prompts[:3], greedy(40))
    rounds = [r for r in engine.timer.records if r.plan == "SpeculativeDecode"]
    assert rounds and all(r.phases.get("target", 0) > 0 for r in rounds)


def policy_runs(pair, prompts, policy: str, per_span_ms: float, draft_ms: float) -> tuple[Engine, Engine]:
    """(round-by-round engine, engine with rounds launched ahead) under `policy` on a table whose verify
    costs per_span_ms a span row and the drafter draft_ms, four requests of uneven budgets; their tokens
    and statistics checked equal."""
    from engine.policy.costs import CostTable

    rows = [
        {"kind": "verify", "batch": b, "span": s, "ms": 1.0 + per_span_ms * s} for b in (1, 2, 4) for s in range(1, 9)
    ]
    rows += [{"kind": "draft", "batch": b, "span": 0, "ms": draft_ms} for b in (1, 2, 4)]
    opts = dict(levers={"policy": policy}, cost_table=CostTable.from_rows(rows))
    script = submit_at({0: [(p, greedy(n)) for p, n in zip(prompts, [70, 55, 64, 80], strict=True)]})
    off = make(pair, False, **opts)
    run(off, script)
    return off, both(pair, script, **opts)[1]


def test_the_adaptive_policy_launches_the_round_it_planned(shipped_tiny, prompts, one_thread):
    """Under policy=adaptive the next round's K is planned once this round's forwards are launched (an
    estimate one round late): a round launches its successor at that K. The policy sees the same calls
    in the same order, so its choices, the tokens and the statistics are the round-by-round engine's."""
    off, engine = policy_runs(shipped_tiny, prompts, "adaptive", 0.1, 0.5)
    assert engine.rounds.policy.chosen == off.rounds.policy.chosen
    assert launched_rounds(engine)[1] > 5


def test_the_budget_policy_launches_the_uniform_round_it_planned(shipped_tiny, prompts, one_thread, monkeypatch):
    """Under policy=budget a round plans the next one once it is launched (estimates one round late; after
    a verify only where no request's tokens left can cap its K_i): a uniform plan launches ahead, a gated
    one's step and a speculative one's round; a ragged one is chosen again in turn. Gated, uniform and
    ragged rounds mix here; the choices, tokens and statistics are the round-by-round engine's."""
    from engine.decode_overlap import OverlappedDecode

    rounds, real = [], OverlappedDecode.launch_round
    monkeypatch.setattr(OverlappedDecode, "launch_round", lambda self, *a: rounds.append(a[3]) or real(self, *a))
    off, engine = policy_runs(shipped_tiny, prompts, "budget", 0.3, 1.0)
    chosen = engine.rounds.policy.chosen
    assert chosen == off.rounds.policy.chosen and chosen[0] > 10 and len(chosen) > 2
    launches, used = launched_rounds(engine)
    assert launches > len(rounds) >= 5 and used == launches and min(rounds) > 0  # gated steps and rounds
