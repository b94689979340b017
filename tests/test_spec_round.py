"""Acceptance bookkeeping of the verify round, by hand-built drafts.

An oracle drafter proposes the plain-greedy continuation, corrupted at a chosen draft position,
so every round's acceptance is known in advance. The real drafter still runs (its state must stay
consistent); only the tokens it proposes are replaced. The oracle reads each request's committed
tokens when it drafts, so rounds run one by one (decode_overlap=False: no round drafts before the one
before it has committed).
"""

from __future__ import annotations

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.policy.choice import round_drafts
from engine.round import draft_limit
from trace_tools import levers_trace_rows

PROMPTS = [[5, 6, 7, 8, 9, 10], [1, 2, 3], list(range(20, 60)), [7] * 9]
BUDGETS = [40, 7, 25, 33]
VOCAB = 300


@pytest.fixture(scope="module")
def plain(tiny_target):
    engine = Engine(EngineConfig(model=str(tiny_target), device="cpu"))
    outs = engine.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))
    return {tuple(p): o.token_ids for p, o in zip(PROMPTS, outs, strict=True)}


def spec_engine(tiny_target, tiny_drafter, plain, corrupt_at: int | None, **levers) -> Engine:
    engine = Engine(
        EngineConfig(
            model=str(tiny_target),
            draft_model=str(tiny_drafter),
            device="cpu",
            trace=True,
            levers=levers,
            decode_overlap=False,
        )
    )
    real_draft = engine.runner.draft

    def oracle(reqs, heads=None):
        real = real_draft(reqs, heads)
        rows = []
        for r in reqs:
            truth = plain[tuple(r.prompt_ids)][len(r.output_ids) :]
            row = (truth + [0] * real.shape[1])[: real.shape[1]]
            if corrupt_at is not None and corrupt_at < len(row):
                row[corrupt_at] = (row[corrupt_at] + 1) % VOCAB
            rows.append(row)
        return torch.tensor(rows, dtype=real.dtype)

    engine.runner.draft = oracle
    return engine


def run(engine: Engine, capsys, budgets=BUDGETS, stop=()):
    params = [SamplingParams(temperature=0, max_tokens=b, ignore_eos=True, stop_token_ids=stop) for b in budgets]
    outs = engine.generate(PROMPTS, params)
    rows = levers_trace_rows(capsys.readouterr().err.splitlines())
    return outs, rows


@pytest.mark.parametrize(("corrupt_at", "label"), [(None, "all"), (0, "none"), (2, "partial")])
def test_acceptance_is_exactly_the_matching_prefix(tiny_target, tiny_drafter, plain, capsys, corrupt_at, label):
    engine = spec_engine(tiny_target, tiny_drafter, plain, corrupt_at)
    outs, rows = run(engine, capsys)
    for prompt, budget, out in zip(PROMPTS, BUDGETS, outs, strict=True):
        assert out.token_ids == plain[tuple(prompt)][:budget]
    k = engine.drafts_per_round
    assert rows and all(not r.gated for r in rows)
    for row in rows:
        expected = row.verified_draft if corrupt_at is None else min(corrupt_at, row.verified_draft)
        assert row.accepted_draft == expected, label
        assert row.committed_tokens == row.accepted_draft + 1
        assert row.verified_draft <= k
    s = engine.stats
    assert s.draft_tokens_accepted == sum(r.accepted_draft for r in rows)
    assert s.committed_tokens == sum(BUDGETS) - len(PROMPTS)  # the prefill sampled one each
    assert (s.rounds, s.drafts, s.gated_rounds) == (len(rows), len(rows), 0)
    assert s.draft_tokens_verified == sum(r.verified_draft for r in rows)
    assert s.accepted_by_position == [sum(r.accepted_draft > p for r in rows) for p in range(k)]


def test_span_is_cut_by_the_budget(tiny_target, tiny_drafter, plain, capsys):
    engine = spec_engine(tiny_target, tiny_drafter, plain, None)
    outs, rows = run(engine, capsys, budgets=[7, 2, 12, 1])
    k = engine.drafts_per_round
    per_request = {}
    for row in rows:
        per_request.setdefault(row.request, []).append(row)
    # req-0: 6 left after prefill -> verify min(k, 5) and commit 6: done in one round.
    assert [(r.verified_draft, r.committed_tokens) for r in per_request[0]] == [(min(k, 5), min(k, 5) + 1)]
    # req-1: 1 left -> a one-token span: zero drafts verified though not gated.
    assert [(r.verified_draft, r.gated) for r in per_request[1]] == [(0, False)]
    assert 3 not in per_request  # max_tokens=1 finishes at prefill
    assert [len(o.token_ids) for o in outs] == [7, 2, 12, 1]


def test_stop_token_inside_the_accepted_run_ends_the_request_there(tiny_target, tiny_drafter, plain, capsys):
    # A token that first appears a few tokens into some request's output, inside an accepted run.
    who, stop = next(
        (i, t[j])
        for i, p in enumerate(PROMPTS)
        for t in [plain[tuple(p)][: BUDGETS[i]]]
        for j in range(2, len(t))
        if t[j] not in t[:j]
    )
    engine = spec_engine(tiny_target, tiny_drafter, plain, None)
    outs, rows = run(engine, capsys, stop=(stop,))
    for prompt, budget, out in zip(PROMPTS, BUDGETS, outs, strict=True):
        ref = plain[tuple(prompt)][:budget]
        cut = ref.index(stop) + 1 if stop in ref else len(ref)
        assert out.token_ids == ref[:cut]
        assert out.finish_reason == ("stop" if stop in ref else "length")
    last = [r for r in rows if r.request == who][-1]
    assert last.committed_tokens < last.accepted_draft + 1  # the accepted tail after the stop is dropped


def test_trim_keeps_spans_uniform_and_never_verifies_more(tiny_target, tiny_drafter, plain, capsys):
    engine = spec_engine(tiny_target, tiny_drafter, plain, None, max_drafts=2)
    outs, rows = run(engine, capsys)
    assert max(r.verified_draft for r in rows) == 2
    for prompt, budget, out in zip(PROMPTS, BUDGETS, outs, strict=True):
        assert out.token_ids == plain[tuple(prompt)][:budget]


def test_gated_rounds_keep_the_capture_and_resume(tiny_target, tiny_drafter, plain, capsys):
    engine = spec_engine(tiny_target, tiny_drafter, plain, None, max_batch=3)
    outs, rows = run(engine, capsys)
    gated = {r.request for r in rows if r.gated}
    assert gated == {0, 1, 2, 3}
    # Gated while >= 3 are active: req-1 (7 tokens) and req-2 (25) finish gated; once two remain,
    # req-0 and req-3 speculate again on the context their gated rounds kept appending.
    resumed = set()
    for req in gated:
        seq = [r for r in rows if r.request == req]
        first_gated = next(i for i, r in enumerate(seq) if r.gated)
        if any(not r.gated and r.verified_draft > 0 and r.accepted_draft > 0 for r in seq[first_gated + 1 :]):
            resumed.add(req)
    assert resumed == {0, 3}
    assert all(r.verified_draft == 0 and r.committed_tokens == 1 for r in rows if r.gated)
    for prompt, budget, out in zip(PROMPTS, BUDGETS, outs, strict=True):
        assert out.token_ids == plain[tuple(prompt)][:budget]


def test_not_ready_request_drops_the_batch_to_plain_decode(tiny_target, tiny_drafter, plain, capsys):
    engine = spec_engine(tiny_target, tiny_drafter, plain, None)
    params = [SamplingParams(temperature=0, max_tokens=b, ignore_eos=True) for b in BUDGETS]
    params[1] = SamplingParams(temperature=0, max_tokens=BUDGETS[1], ignore_eos=True, speculate=False)
    outs = engine.generate(PROMPTS, params)
    rows = levers_trace_rows(capsys.readouterr().err.splitlines())
    # While req-1 is active the whole batch decodes plainly and loses its drafter state: the
    # pre-existing one-way latch of the NotReady fallback.
    assert rows == []
    for prompt, budget, out in zip(PROMPTS, BUDGETS, outs, strict=True):
        assert out.token_ids == plain[tuple(prompt)][:budget]


@pytest.mark.parametrize(
    ("per_round", "max_drafts", "k"),
    [(7, 0, 7), (7, 4, 4), (7, 9, 7), (16, 1, 1), (16, 0, 16)],
)
def test_round_drafts(per_round, max_drafts, k):
    assert round_drafts(per_round, max_drafts) == k


@pytest.mark.parametrize(("k", "remaining", "limit"), [(7, 20, 7), (7, 5, 4), (7, 1, 0), (0, 9, 0)])
def test_draft_limit(k, remaining, limit):
    assert draft_limit(k, remaining) == limit


def test_steps_read_only_inputs_staged_for_their_requests(tiny_target, tiny_drafter):
    engine = Engine(EngineConfig(model=str(tiny_target), draft_model=str(tiny_drafter), device="cpu"))
    for prompt in PROMPTS[:3]:
        engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    engine.step()  # the prefill
    reqs, runner = list(engine.scheduler.running), engine.runner
    runner.stage(reqs[:2], [1, 2])
    with pytest.raises(RuntimeError, match="stage"):
        runner.draft(reqs)
    with pytest.raises(RuntimeError, match="stage"):
        runner.decode(reqs)
    runner.stage(reqs, [3, 0, 5])
    staged = {name: runner.field(name, len(reqs)).tolist() for name in ("token", "row", "num_kv", "limit")}
    assert staged == {
        "token": [r.current_token for r in reqs],
        "row": [r.slot for r in reqs],
        "num_kv": [r.num_kv for r in reqs],
        "limit": [3, 0, 5],
    }
    drafts = runner.draft(reqs)
    _, rounds = runner.verify(reqs, drafts, 4, engine.rounds.accept)
    assert rounds.shape == (3, 2 * 4 + 2) and rounds[1, 0] == 0  # limit 0: nothing accepted
    assert rounds[:, 1:5].tolist() == drafts[:, :4].tolist()
