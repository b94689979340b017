"""The adaptive policy in the engine (tiny pair, CPU): lossless against plain greedy, K chosen per round
from the cost table, gated (K = 0) under load past break-even, and speculation resumes afterwards."""

from __future__ import annotations

import time

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.__main__ import main
from engine.knobs import KnobError, read_knobs
from engine.levers import LeverError
from tests.policy_tables import csv_text, table
from trace_tools import levers_trace_rows

PROMPTS = [[5, 6, 7, 8, 9, 10], [1, 2, 3], list(range(20, 60)), [7] * 9]
BUDGETS = [40, 7, 25, 33]  # staggered: the batch shrinks 4 -> 3 -> 2 -> 1
SPANS = range(1, 9)


def loses_from_3():
    """Speculation is a loss at batch 3 and up (the drafter costs 100 ms there), a win below."""
    return table(lambda b, s: 10.0 + s, lambda b: 1.0 if b <= 2 else 100.0, SPANS)


@pytest.fixture(scope="module")
def plain(tiny_target):
    engine = Engine(EngineConfig(model=str(tiny_target), device="cpu"))
    outs = engine.generate(PROMPTS, [SamplingParams(temperature=0, max_tokens=b, ignore_eos=True) for b in BUDGETS])
    return {tuple(p): o.token_ids for p, o in zip(PROMPTS, outs, strict=True)}


def adaptive_engine(tiny_target, tiny_drafter, cost_table) -> Engine:
    config = EngineConfig(
        model=str(tiny_target),
        draft_model=str(tiny_drafter),
        device="cpu",
        trace=True,
        levers={"policy": "adaptive"},
        cost_table=cost_table,
    )
    return Engine(config)


def oracle_engine(tiny_target, tiny_drafter, plain, cost_table) -> Engine:
    """The real drafter runs, its tokens replaced by the plain continuation: every draft is accepted."""
    engine = adaptive_engine(tiny_target, tiny_drafter, cost_table)
    real_draft = engine.runner.draft

    def oracle(reqs, heads=None):
        real = real_draft(reqs, heads)
        rows = [(plain[tuple(r.prompt_ids)][len(r.output_ids) :] + [0] * real.shape[1])[: real.shape[1]] for r in reqs]
        return torch.tensor(rows, dtype=real.dtype)

    engine.runner.draft = oracle
    return engine


def run(engine, capsys):
    outs = engine.generate(PROMPTS, [SamplingParams(temperature=0, max_tokens=b, ignore_eos=True) for b in BUDGETS])
    return outs, levers_trace_rows(capsys.readouterr().err.splitlines())


def test_gated_under_load_then_resumes_and_stays_lossless(tiny_target, tiny_drafter, plain, capsys, one_thread):
    engine = oracle_engine(tiny_target, tiny_drafter, plain, loses_from_3())
    outs, rows = run(engine, capsys)
    for p, o in zip(PROMPTS, outs, strict=True):
        assert o.token_ids == plain[tuple(p)]
    gated = [r for r in rows if r.gated]
    assert gated and all(r.span_limit == 0 for r in gated)
    after = {r.request for r in gated}
    resumed = [r for r in rows if not r.gated and r.request in after and r.accepted_draft > 0]
    assert resumed, "no gated request speculated and accepted after the batch shrank"
    assert {r.span_limit for r in rows} >= {0, engine.drafts_per_round}
    assert all(r.verified_draft <= r.span_limit for r in rows)


def test_every_round_reports_its_wall_and_no_prefill_does(tiny_target, tiny_drafter, plain, capsys, one_thread):
    engine = oracle_engine(tiny_target, tiny_drafter, plain, loses_from_3())
    assert not engine.rounds.policy.learn_host  # a table given at start is the whole cost
    engine.set_cost_table(loses_from_3())  # as a benchmark sets one it measured: the host term learns
    policy, walls = engine.rounds.policy, []

    def observe_wall(batch, k, ms, context):
        walls.append((batch, k, ms))
        assert context is not None and context > 0  # the mean context its decision read
        learn(batch, k, ms, context)

    learn, policy.observe_wall = policy.observe_wall, observe_wall
    _, rows = run(engine, capsys)
    assert sum(b for b, _, _ in walls) == len(rows)  # one wall per round, one trace line per request in it
    ks = {k for _, k, _ in walls}  # near their ends the draining wave may take fewer drafts than all
    assert {0, engine.drafts_per_round} <= ks <= set(range(engine.drafts_per_round + 1))
    assert all(ms > 0 for *_, ms in walls)
    assert policy.host.ms  # the host term took them


def test_a_step_that_captured_a_graph_sends_no_wall(tiny_target, tiny_drafter, plain, capsys, one_thread):
    # On the H200 the captures of a bucket's batches 40, 48 and 56 taught the host term 3.2 ms there.
    engine = oracle_engine(tiny_target, tiny_drafter, plain, loses_from_3())
    engine.set_cost_table(loses_from_3())
    walls, graphs, run_step = [], engine.runner.graphs, engine.steps.run
    engine.rounds.policy.observe_wall = lambda batch, k, ms, context: walls.append(batch)

    def capturing(step, no_more_requests):
        run_step(step, no_more_requests)
        graphs.captures += len(step.reqs) % 2  # every step of an odd batch "captured" a graph

    engine.steps.run = capturing
    run(engine, capsys)
    assert 2 in walls and 4 in walls and not {1, 3} & set(walls)


def test_cheap_drafter_speculates_every_round_with_all_drafts(tiny_target, tiny_drafter, plain, capsys, one_thread):
    engine = oracle_engine(tiny_target, tiny_drafter, plain, table(lambda b, s: 10.0, lambda b: 1.0, SPANS))
    outs, rows = run(engine, capsys)
    assert [o.token_ids for o in outs] == [plain[tuple(p)] for p in PROMPTS]
    assert rows and not any(r.gated for r in rows)
    full, capped = engine.drafts_per_round, set()
    for r in rows:  # a round verifies fewer only where no request of it may accept more: their last
        if r.span_limit < full:
            capped.add(r.request)
        else:
            assert r.request not in capped, "a full round after a capped one: the cap is not the tokens left"
    assert capped and sum(r.span_limit == full for r in rows) > len(rows) / 2


def test_cost_table_from_the_environment(tiny_target, tiny_drafter, monkeypatch, tmp_path):
    path = tmp_path / "profile.csv"
    path.write_text(csv_text(loses_from_3()))
    monkeypatch.setenv("PEGAINFER_SPEC_POLICY", "adaptive")
    monkeypatch.setenv("PEGAINFER_SPEC_COST_TABLE", str(path))
    engine = Engine(EngineConfig(model=str(tiny_target), draft_model=str(tiny_drafter), device="cpu"))
    assert engine.rounds.policy is not None and engine.rounds.policy.table.draft[3] == 100.0


def test_static_is_the_default_and_keeps_no_policy(tiny_target, tiny_drafter):
    engine = Engine(EngineConfig(model=str(tiny_target), draft_model=str(tiny_drafter), device="cpu"))
    assert engine.levers.policy == "static" and engine.rounds.policy is None


@pytest.mark.parametrize("raw", ["", "Adaptive", "dynamic", "0"])
def test_unknown_policy_refuses_to_start_naming_the_variable(monkeypatch, raw):
    monkeypatch.setenv("PEGAINFER_SPEC_POLICY", raw)
    with pytest.raises(KnobError, match=r"PEGAINFER_SPEC_POLICY=.*static\|adaptive"):
        Engine(EngineConfig(model="/nonexistent/checkpoint", device="cpu"))


def test_bad_policy_values_from_every_source(capsys, tmp_path):
    with pytest.raises(LeverError, match="policy"):
        EngineConfig(model="x", levers={"policy": "fast"})
    with pytest.raises(SystemExit) as err:
        main(["generate", "--prompt", "x", "--policy", "fast"])
    assert err.value.code == 2 and "--policy='fast' is not one of static|adaptive" in capsys.readouterr().err
    with pytest.raises(ValueError, match="cost_table"):
        EngineConfig(model="x", cost_table=3)
    with pytest.raises(KnobError, match="PEGAINFER_SPEC_COST_TABLE"):
        read_knobs({"PEGAINFER_SPEC_COST_TABLE": "a\0b"})


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("kind,batch,span\nverify,1,1\n", "KeyError"),
        ("kind,batch,span,ms\nverify,1,1,-2\n", "ms must be > 0"),
        (None, "No such file"),
    ],
)
def test_a_bad_cost_table_file_is_refused_naming_it(tmp_path, text, why):
    path = tmp_path / "profile.csv"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ValueError, match=why) as err:
        Engine(EngineConfig(model="/nonexistent", device="cpu", levers={"policy": "adaptive"}, cost_table=path))
    assert str(path) in str(err.value)


def test_the_acceptance_estimate_outlives_lever_changes_and_a_new_table(tiny_target, tiny_drafter):
    # A bench interleaves arms on one engine: a policy re-created at each switch back to adaptive would
    # start from its optimistic seed every run (K=15 rounds at batch 256 on the H200).
    engine = Engine(
        EngineConfig(
            model=str(tiny_target),
            draft_model=str(tiny_drafter),
            device="cpu",
            levers={"policy": "adaptive"},
            cost_table=loses_from_3(),
        )
    )
    engine.generate(PROMPTS, [SamplingParams(temperature=0, max_tokens=b, ignore_eos=True) for b in BUDGETS])
    policy = engine.rounds.policy
    learned = list(policy.conditional)
    assert learned != policy.prior  # the rounds taught it something
    engine.set_levers(policy="static")
    assert engine.rounds.policy is None
    engine.set_levers(policy="adaptive")
    assert engine.rounds.policy is policy and policy.conditional == learned
    engine.set_cost_table(loses_from_3())
    assert engine.rounds.policy is not policy and engine.rounds.policy.conditional == learned


def test_host_bound_speculation_is_learnt_and_gated(tiny_target, tiny_drafter, capsys, one_thread):
    # The table says a round of all drafts costs what a gated one does; every speculative round's wall
    # carries 150 ms the table cannot see (a host-bound drafter's bookkeeping, here a sleep). Learnt from
    # the walls, that turns the policy to K = 0 while both requests still run, losslessly.
    prompts, budgets = [PROMPTS[0], PROMPTS[3]], [96, 80]
    params = [SamplingParams(temperature=0, max_tokens=b, ignore_eos=True) for b in budgets]
    plain = Engine(EngineConfig(model=str(tiny_target), device="cpu")).generate(prompts, params)
    flat = table(lambda b, s: 5.0, lambda b: 0.1, SPANS)
    reference = {tuple(p): o.token_ids for p, o in zip(prompts, plain, strict=True)}
    engine = oracle_engine(tiny_target, tiny_drafter, reference, flat)
    engine.set_cost_table(flat)  # as measured on this device: the host term learns
    oracle = engine.runner.draft

    def host_bound(reqs, heads=None):
        time.sleep(0.15)
        return oracle(reqs, heads)

    engine.runner.draft = host_bound
    outs = engine.generate(prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    rows = levers_trace_rows(capsys.readouterr().err.splitlines())
    both = [r.span_limit for r in rows if r.request == 1]  # the shorter request: the batch is 2 throughout
    later = both[len(both) // 2 :]  # learnt within a few rounds; a rare probe of K > 0 may follow
    assert both[0] == engine.drafts_per_round and later.count(0) >= 0.8 * len(later)
    tail = both[2 * len(both) // 3 :]
    assert not any(a and b for a, b in zip(tail, tail[1:], strict=False))  # a probe is a lone round
    host = engine.rounds.policy.host
    assert host.predict(2, True) > 4 * max(host.predict(2, False), 5.0)  # the sleep, not the gated round's host work


def counting_decides(engine) -> list[int]:
    """The batch of every round the policy decided in turn (a round that took a plan made during the
    gated round before it is not among them)."""
    policy, batches = engine.rounds.policy, []
    decide = policy.decide
    policy.decide = lambda batch, *rest: batches.append(batch) or decide(batch, *rest)
    return batches


def test_a_gated_round_plans_the_next_while_the_device_runs(tiny_target, tiny_drafter, plain, capsys, one_thread):
    # The table given at start is the whole cost (no host term learnt from walls), so a plan made a
    # round early is exactly the decision made in turn: the same rounds, the same tokens.
    planned = oracle_engine(tiny_target, tiny_drafter, plain, loses_from_3())
    decided = counting_decides(planned)
    outs, rows = run(planned, capsys)
    in_turn = oracle_engine(tiny_target, tiny_drafter, plain, loses_from_3())
    spans = in_turn.rounds.adaptive
    launched = spans.launched
    spans.launched = lambda reqs, draining, limits: limits is not None and launched(reqs, draining, limits)
    outs_in_turn, rows_in_turn = run(in_turn, capsys)
    assert rows == rows_in_turn and [o.token_ids for o in outs] == [o.token_ids for o in outs_in_turn]
    policy = planned.rounds.policy
    assert policy.chosen == in_turn.rounds.policy.chosen and policy.chosen[0] >= 10
    assert len(decided) <= policy.chosen.total() - policy.chosen[0] + 1  # after the first gated round: plans


def test_a_plan_for_another_batch_is_dropped(tiny_target, tiny_drafter, plain, one_thread):
    engine = oracle_engine(tiny_target, tiny_drafter, plain, loses_from_3())
    for p, b in zip(PROMPTS, BUDGETS, strict=True):
        engine.add_request(p, SamplingParams(temperature=0, max_tokens=b, ignore_eos=True))
    while engine.rounds.adaptive.ahead is None:
        engine.step()
    planned_for = engine.rounds.adaptive.ahead.reqs
    engine.abort(planned_for[0].id)
    decided = counting_decides(engine)
    engine.step()
    assert decided == [len(planned_for) - 1] and engine.rounds.adaptive.ahead.reqs == planned_for[1:]


def test_a_speculative_round_plans_the_next_while_the_device_runs(tiny_target, tiny_drafter, plain, capsys, one_thread):
    """Where speculation pays at every batch, a round whose outcome cannot finish a request or cap the
    next one's K leaves the next round a plan: most rounds take one, every outcome still reaches the
    estimate (one round late), and the tokens are plain decode's (the tiny pair's own drafter)."""
    engine = adaptive_engine(tiny_target, tiny_drafter, table(lambda b, s: 10.0 + s, lambda b: 1.0, SPANS))
    decided, observed = counting_decides(engine), []
    observe = engine.rounds.policy.observe
    engine.rounds.policy.observe = lambda limits, accepted: observed.append(len(limits)) or observe(limits, accepted)
    outs, rows = run(engine, capsys)
    for p, o in zip(PROMPTS, outs, strict=True):
        assert o.token_ids == plain[tuple(p)]
    rounds = engine.rounds.policy.chosen.total()
    assert rounds >= 20 and len(decided) <= rounds // 2
    engine.rounds.adaptive.flush()  # the last round's outcome waits for a next launch
    assert sum(observed) == sum(not r.gated for r in rows)
