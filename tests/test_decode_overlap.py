"""Plain decode with its next step launched ahead (engine/decode_overlap.py): every request's tokens,
finish reason and logprobs are those of the step-by-step engine (EngineConfig.decode_overlap=False),
whatever happens between steps: a stop token, a request admitted or aborted mid-decode, a sampled or
logprob request in the batch, a block boundary, preemption. The steps launched ahead are counted, so
a test also fails if none was launched or none was used."""

from __future__ import annotations

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.timing import PhaseTimer

PROMPTS = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16, 17], [3, 4]]
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (CUDA graphs, pinned copies)")


def make(tiny_target, overlap: bool, **options) -> Engine:
    cfg = dict(model=str(tiny_target), device="cpu", max_num_seqs=4, kv_block_size=4) | options
    return Engine(EngineConfig(decode_overlap=overlap, **cfg))


def run(engine: Engine, script) -> dict:
    """script(engine, step_no) may add or abort requests between steps; the final outputs by id."""
    done, n = {}, 0
    while engine.has_unfinished() or n == 0:
        script(engine, n)
        for out in engine.step():
            if out.finished:
                done[out.request_id] = (out.token_ids, out.finish_reason, out.logprobs)
        n += 1
    return done


def both(tiny_target, script, **options) -> tuple[dict, Engine]:
    off = run(make(tiny_target, False, **options), script)
    engine = make(tiny_target, True, **options)
    on = run(engine, script)
    assert on == off
    return on, engine


def submit_at(schedule: dict[int, list[tuple[list[int], SamplingParams]]]):
    def script(engine: Engine, n: int) -> None:
        for prompt, params in schedule.get(n, []):
            engine.add_request(prompt, params)

    return script


def test_plain_decode_of_uneven_lengths_matches_and_uses_the_launched_steps(tiny_target, one_thread):
    lengths = [3, 10, 17, 12]
    script = submit_at(
        {
            0: [
                (p, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
                for p, n in zip(PROMPTS, lengths, strict=True)
            ]
        }
    )
    out, engine = both(tiny_target, script)
    assert sorted(len(t) for t, _, _ in out.values()) == sorted(lengths)
    ov = engine.rounds.overlap
    assert ov.used > 0 and ov.launches >= ov.used and ov.launched is None


def test_a_stop_token_mid_batch_drops_the_launched_step(tiny_target, one_thread):
    free_run = run(
        make(tiny_target, False, kv_block_size=16),
        submit_at({0: [(PROMPTS[0], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))]}),
    )
    ((tokens, _, _),) = free_run.values()
    stop = tokens[6]  # a token this request produces mid-run: its first occurrence ends it there
    params = SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[stop], ignore_eos=True)
    other = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    # 16-row blocks: every step of these runs can launch its successor (4-row blocks stop one in four)
    out, engine = both(tiny_target, submit_at({0: [(PROMPTS[0], params), (PROMPTS[1], other)]}), kv_block_size=16)
    assert {reason for _, reason, _ in out.values()} == {"stop", "length"}
    assert engine.rounds.overlap.launches > engine.rounds.overlap.used  # the step after the stop was dropped


def admit_and_abort(max_tokens: int, admit_at: int, abort_at: int, prompts=PROMPTS):
    """Two requests from the start, a third admitted before step admit_at, the first aborted before
    step abort_at."""
    long, ids = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True), []

    def script(engine: Engine, n: int) -> None:
        if n == 0:
            ids.extend(engine.add_request(p, long) for p in prompts[:2])
        if n == admit_at:
            engine.add_request(prompts[2], long)
        if n == abort_at:
            engine.abort(ids[0])

    return script


def test_requests_admitted_and_aborted_mid_decode(tiny_target, one_thread):
    out, engine = both(tiny_target, admit_and_abort(15, admit_at=5, abort_at=8))  # a prefill between two steps
    assert sorted(reason for _, reason, _ in out.values()) == ["abort", "length", "length"]
    assert engine.rounds.overlap.used > 0


def test_a_batch_of_the_same_size_but_other_requests_drops_the_launched_step(tiny_target, one_thread):
    """One request aborted and another admitted between two steps: the next decode batch has as many
    rows as the launched one, but not its requests."""
    out, engine = both(tiny_target, admit_and_abort(12, admit_at=4, abort_at=4), kv_block_size=16)
    assert sorted(reason for _, reason, _ in out.values()) == ["abort", "length", "length"]
    assert engine.rounds.overlap.launches > engine.rounds.overlap.used > 0


def test_a_queue_behind_a_full_batch_still_launches_ahead(tiny_target, one_thread):
    """Requests waiting for a slot while every slot runs: the next step cannot be their prefill until a
    request ends, so steps launch ahead; each admission (after a request's last token) drops nothing."""
    lengths = [5, 9, 7, 6]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths]
    submit, queued = submit_at({0: list(zip(PROMPTS, params, strict=True))}), []

    def script(engine: Engine, n: int) -> None:
        submit(engine, n)
        queued.append((len(engine.scheduler.waiting), engine.rounds.overlap.launches))

    out, engine = both(tiny_target, script, max_num_seqs=2, kv_block_size=16)
    assert sorted(len(t) for t, _, _ in out.values()) == sorted(lengths)
    assert any(waiting and launches for waiting, launches in queued)  # launched with the queue waiting
    assert engine.rounds.overlap.used == engine.rounds.overlap.launches > 0


def test_sampled_and_logprob_requests_run_step_by_step(tiny_target, one_thread):
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    sampled = SamplingParams(max_tokens=8, ignore_eos=True, temperature=0.8, seed=3)
    scored = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=2)
    for odd in (sampled, scored):
        out, engine = both(tiny_target, submit_at({0: [(PROMPTS[0], greedy), (PROMPTS[1], odd)]}))
        assert engine.rounds.overlap.launches == 0
    assert any(lp for _, _, lp in out.values())


def test_preemption_under_a_small_pool(tiny_target, one_thread):
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    out, engine = both(tiny_target, submit_at({0: [(p, params) for p in PROMPTS]}), num_kv_blocks=22)
    assert engine.preemptions > 0 and all(len(t) == 24 for t, _, _ in out.values())
    assert engine.rounds.overlap.used > 0


@pytest.mark.parametrize("max_batch", [1, 3])
def test_gated_rounds_launch_ahead_and_count_as_step_by_step(tiny_target, tiny_drafter, one_thread, max_batch):
    """With a drafter and the load gate: gated rounds (the batch at or above max_batch) launch their next
    step too, keep the capture, and count and trace as one by one; max_batch 3 mixes in speculative rounds
    as the batch shrinks (a gated step launched before the shrink is dropped)."""
    lengths = [6, 14, 9, 20]
    opts = dict(draft_model=str(tiny_drafter), levers={"max_batch": max_batch}, kv_block_size=16)
    script = submit_at(
        {
            0: [
                (p, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
                for p, n in zip(PROMPTS, lengths, strict=True)
            ]
        }
    )
    off_engine = make(tiny_target, False, **opts)
    off = run(off_engine, script)
    out, engine = both(tiny_target, script, **opts)
    assert out == off and engine.stats == off_engine.stats and engine.stats.gated_rounds > 0
    assert engine.rounds.overlap.used > 0
    if max_batch == 3:
        assert engine.stats.rounds > engine.stats.gated_rounds  # speculative rounds ran too


def test_rounds_the_scheduler_gates_under_the_adaptive_policy_run_step_by_step(tiny_target, tiny_drafter, one_thread):
    """MAX_BATCH gates these rounds, not the policy, which plans nothing ahead for them: nothing is
    launched ahead."""
    from engine.policy.costs import CostTable

    rows = [{"kind": "verify", "batch": b, "span": s, "ms": 1.0 + s} for b in (1, 2, 4) for s in range(1, 9)]
    rows += [{"kind": "draft", "batch": b, "span": 0, "ms": 0.5} for b in (1, 2, 4)]
    opts = dict(
        draft_model=str(tiny_drafter),
        levers={"policy": "adaptive", "max_batch": 1},
        cost_table=CostTable.from_rows(rows),
    )
    script = submit_at({0: [(p, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)) for p in PROMPTS[:2]]})
    out, engine = both(tiny_target, script, **opts)
    assert engine.stats.gated_rounds > 0 and engine.rounds.overlap.launches == 0


def test_rounds_the_adaptive_policy_gates_launch_their_successor_where_its_plan_gates_again(
    tiny_target, tiny_drafter, one_thread
):
    """Verifying costs far more than a one-token round in this table, so the policy gates: each gated
    round's plan for the next round is made while it runs, and where it gates the same requests again
    that round is launched ahead. Tokens and statistics are the step-by-step engine's."""
    from engine.policy.costs import CostTable

    rows = [
        {"kind": "verify", "batch": b, "span": s, "ms": 1.0 + 50.0 * (s - 1)} for b in (1, 2, 4) for s in range(1, 9)
    ]
    rows += [{"kind": "draft", "batch": b, "span": 0, "ms": 30.0} for b in (1, 2, 4)]
    opts = dict(draft_model=str(tiny_drafter), levers={"policy": "adaptive"}, cost_table=CostTable.from_rows(rows))
    lengths = [12, 20, 7]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths]
    out, engine = both(tiny_target, submit_at({0: list(zip(PROMPTS, params, strict=False))}), **opts)
    ov = engine.rounds.overlap
    assert engine.stats.gated_rounds > 0 and ov.used > 0 and ov.launches >= ov.used
    assert sorted(len(t) for t, _, _ in out.values()) == sorted(lengths)


def test_a_step_at_a_block_boundary_takes_its_block_first(tiny_target, one_thread):
    """A step launched ahead writes one row past the committed ones: that row's block is taken at its
    launch and written to the device's table. A dry pool takes nothing and launches nothing."""
    engine = make(tiny_target, True)
    rid = engine.add_request(PROMPTS[0], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    engine.step()  # the prefill: 4 rows, one 4-row block
    (req,), ov = engine._requests[rid], engine.rounds.overlap  # one completion
    req.num_kv = 3  # this step writes row 3, the one launched after it row 4: the next block
    assert not ov.eligible([req], admitting=True) and len(req.blocks) == 1
    assert ov.eligible([req], admitting=False) and len(req.blocks) == 2
    assert engine.runner.block_tables[req.slot, : len(req.blocks)].tolist() == req.blocks
    engine.blocks.allocate(engine.blocks.num_free)
    req.num_kv = 4 * len(req.blocks) - 1
    assert not ov.eligible([req], admitting=False) and len(req.blocks) == 2


def test_every_step_but_the_last_launches_its_successor(tiny_target, one_thread):
    """One request on 4-row blocks crosses a boundary every fourth step: each of its decode steps but
    the first is one launched ahead, and the tokens are the step-by-step engine's."""
    params = SamplingParams(temperature=0, max_tokens=14, ignore_eos=True)
    out, engine = both(tiny_target, submit_at({0: [(PROMPTS[1], params)]}))
    ((tokens, _, _),) = out.values()
    assert len(tokens) == 14 and engine.rounds.overlap.used == engine.rounds.overlap.launches == 12


def test_the_bench_timer_runs_over_launched_steps(tiny_target, one_thread):
    engine = make(tiny_target, True)
    engine.timer = PhaseTimer(engine.device)
    engine.generate(PROMPTS[:2], SamplingParams(temperature=0, max_tokens=9, ignore_eos=True))
    assert engine.rounds.overlap.used > 0
    assert len(engine.timer.records) == 9 and all(r.total > 0 for r in engine.timer.records)


@gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gpu_graph_replays_launched_ahead_match_step_by_step(tiny_target, dtype):
    """On the triton backend with CUDA graphs: the launched step's tokens come from the graph's argmax
    on the device, through the staged buffer, while the host reads the step before."""
    opts = dict(device="cuda", backend="triton", dtype=dtype, max_num_seqs=17, kv_block_size=16)
    lengths = [3, 30, 17, 12, 25]
    script = submit_at(
        {
            0: [
                (p, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
                for p, n in zip(PROMPTS * 2, lengths, strict=False)
            ]
        }
    )
    out, engine = both(tiny_target, script, **opts)
    assert engine.runner.graphs.captured and engine.rounds.overlap.used > 20
    engine.timer = PhaseTimer(engine.device)
    engine.generate(PROMPTS[:3], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    decode = [r for r in engine.timer.records if r.plan == "Decode"]
    assert len(decode) == 19 and all(r.phases["target"] > 0 for r in decode)


@gpu
def test_gpu_block_rows_are_assigned_without_waiting_for_the_stream(tiny_target):
    """A step at a block boundary assigns its new block while the step launched ahead runs: the copy
    is queued behind it, and the host goes on (a pageable copy waited for the stream to drain)."""
    from types import SimpleNamespace

    engine = make(tiny_target, True, device="cuda", max_num_seqs=4, kv_block_size=16)
    reqs = [SimpleNamespace(slot=i, blocks=[7 + i, 3, 11 + i][: 1 + i % 3]) for i in range(4)]
    torch.cuda.synchronize()
    torch.cuda._sleep(500_000_000)  # ~0.25 s of device time queued ahead of the copy
    engine.runner.assign_blocks(reqs)
    assert not torch.cuda.current_stream().query()  # the host is back while the stream still runs
    torch.cuda.synchronize()
    for r in reqs:
        row = engine.runner.block_tables[r.slot].tolist()
        assert row[: len(r.blocks)] == r.blocks and not any(row[len(r.blocks) :])


def test_an_arrival_waits_one_step_for_the_step_launched_ahead(tiny_target, one_thread):
    """A request that arrives while a decode step is launched ahead is prefilled after that step, not
    before it (it would drop it): every step launched is used, and the tokens are the step-by-step ones."""
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    held = []

    def script(engine: Engine, n: int) -> None:
        if n in (0, 5):
            for p in PROMPTS[:2] if n == 0 else PROMPTS[2:3]:
                engine.add_request(p, params)
        if engine.rounds.overlap.enabled:
            held.append(engine.rounds.overlap.holds())

    out, engine = both(tiny_target, script, kv_block_size=16)
    assert sorted(len(t) for t, _, _ in out.values()) == [12, 12, 12]
    ov = engine.rounds.overlap
    assert held[5] and ov.used == ov.launches > 0
