"""Hedged verify rounds stay lossless, and a winning chain's KV and feature rows become canonical.

An oracle replaces the drafter's proposals with the plain-greedy continuation: the main chain is
corrupted at a chosen draft position c, and the hedge chain branching at c carries the right token
(the others are wrong at their branch), so that chain must win every round where it is verified.
The real drafter still runs (its state must stay consistent); only the tokens are replaced. After
every step each running request's KV rows and drafter context K/V, and before every draft the
winning chains' feature rows that join the context, are compared with an HF forward over its
committed tokens.
"""

from __future__ import annotations

import json

import pytest
import torch
from transformers import Qwen3ForCausalLM as HFQwen3

from engine import Engine, EngineConfig, SamplingParams
from tests.checkpoints import VOCAB, make_dspark_drafter
from tests.kv_checks import check_draft_kv, check_kv, hf_state
from trace_tools import hedge_trace_rows, levers_trace_rows, summarize_hedge

PROMPTS = [[5, 6, 7, 8, 9, 10], [1, 2, 3], list(range(20, 60)), [7] * 9]
BUDGETS = [40, 7, 25, 33]
POSITIONS = (0, 1, 2)


@pytest.fixture(scope="module")
def dspark(tmp_path_factory):
    directory = tmp_path_factory.mktemp("dspark-hedge")
    make_dspark_drafter(directory, layout="deepspec", block_size=5)
    return directory


@pytest.fixture(scope="module")
def hf_target(tiny_target):
    return HFQwen3.from_pretrained(str(tiny_target), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def plain(tiny_target):
    engine = Engine(EngineConfig(model=str(tiny_target), device="cpu"))
    outs = engine.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))
    return {tuple(p): o.token_ids for p, o in zip(PROMPTS, outs, strict=True)}


def hedged_engine(target, drafter, plain, corrupt_at: int | None, contexts: list, **levers) -> Engine:
    engine = Engine(
        EngineConfig(
            model=str(target),
            draft_model=str(drafter),
            device="cpu",
            trace=True,
            levers={"hedge": 8, "hedge_positions": POSITIONS, **levers},
        )
    )
    real_draft, real_chains = engine.runner.draft, engine.runner.draft_chains
    real_store = engine.rounds._store_pending_context

    def store_pending(reqs):
        for r in reqs:
            if r.ctx_pending:
                contexts.append((r, r.draft_kv_len, torch.cat(r.ctx_pending).clone()))
        real_store(reqs)

    def main_rows(reqs, width):
        rows = []
        for r in reqs:
            truth = (plain[tuple(r.prompt_ids)][len(r.output_ids) :] + [0] * width)[:width]
            main = list(truth)
            if corrupt_at is not None:
                main[corrupt_at] = (main[corrupt_at] + 1) % VOCAB
            rows.append((truth, main))
        return rows

    def draft(reqs, heads=None):
        real = real_draft(reqs, heads)
        return torch.tensor([m for _, m in main_rows(reqs, real.shape[1])])

    def draft_chains(reqs, positions):
        real, _ = real_chains(reqs, positions)
        rows = main_rows(reqs, real.shape[1])
        chains = []
        for truth, main in rows:
            mine = []
            for p in positions:
                branch = truth[p] if p == corrupt_at else (truth[p] + 2) % VOCAB  # != main[p] either way
                mine.append([*main[:p], branch, *truth[p + 1 :]])
            chains.append(mine)
        return torch.tensor([m for _, m in rows]), torch.tensor(chains)

    engine.runner.draft, engine.runner.draft_chains = draft, draft_chains
    engine.rounds._store_pending_context = store_pending
    return engine


def run_checked(engine: Engine, hf, capsys, contexts: list):
    params = [SamplingParams(temperature=0, max_tokens=b, ignore_eos=True) for b in BUDGETS]
    ids = [engine.add_request(p, sp) for p, sp in zip(PROMPTS, params, strict=True)]
    done, kv_checks, draft_checks = {}, 0, 0
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
        kv_checks += check_kv(engine, hf)
        draft_checks += check_draft_kv(engine, hf)
    taps = engine.draft_cfg.target_layer_ids
    for r, start, rows in contexts:  # what joined each drafter context = the committed tokens' features
        _, feats = hf_state(hf, (r.prompt_ids + r.output_ids)[: start + rows.shape[0]], taps)
        torch.testing.assert_close(rows, feats[start:], atol=2e-4, rtol=1e-4)
    lines = capsys.readouterr().err.splitlines()
    assert kv_checks > 10 and draft_checks > 10
    return [done[i] for i in ids], levers_trace_rows(lines), hedge_trace_rows(lines)


def test_winning_chain_becomes_canonical(tiny_target, dspark, plain, hf_target, capsys):
    c = 1
    contexts: list = []
    engine = hedged_engine(tiny_target, dspark, plain, c, contexts)
    outs, rounds, hedges = run_checked(engine, hf_target, capsys, contexts)
    for prompt, budget, out in zip(PROMPTS, BUDGETS, outs, strict=True):
        assert out.token_ids == plain[tuple(prompt)][:budget]
    wins = [h for h in hedges if h.winner]
    assert wins and engine.stats.hedge_wins == len(wins)
    assert contexts  # winning rows joined a context at the next draft (and matched HF above)
    for h in hedges:
        assert h.main_accepted <= c
        if h.chains > c and h.main_accepted == c:  # the chain at position c was verified
            assert h.winner == c + 1 and h.best_accepted > c
        else:
            assert h.winner == 0 and h.best_accepted == h.main_accepted
    # The round line describes the winning chain.
    assert {(r.request, r.accepted_draft) for r in rounds if r.accepted_draft > c} == {
        (h.request, h.best_accepted) for h in wins
    }
    assert engine.stats.committed_tokens == sum(BUDGETS) - len(PROMPTS)


def test_losing_chains_leave_no_trace(tiny_target, dspark, plain, hf_target, capsys):
    contexts: list = []
    engine = hedged_engine(tiny_target, dspark, plain, None, contexts)
    outs, rounds, hedges = run_checked(engine, hf_target, capsys, contexts)
    for prompt, budget, out in zip(PROMPTS, BUDGETS, outs, strict=True):
        assert out.token_ids == plain[tuple(prompt)][:budget]
    assert hedges and all(h.winner == 0 and h.best_accepted == h.main_accepted for h in hedges)
    assert sum(h.chains for h in hedges) == engine.stats.hedge_chains > len(hedges)
    assert engine.stats.hedge_wins == 0
    assert all(r.accepted_draft == r.verified_draft for r in rounds)


def test_gated_rounds_have_no_chains(tiny_target, dspark, plain, capsys):
    engine = hedged_engine(tiny_target, dspark, plain, 1, [], max_batch=3)
    outs = engine.generate(PROMPTS, [SamplingParams(temperature=0, max_tokens=b, ignore_eos=True) for b in BUDGETS])
    lines = capsys.readouterr().err.splitlines()
    gated = {(r.request) for r in levers_trace_rows(lines) if r.gated}
    assert gated and hedge_trace_rows(lines)  # gated while >= 3 active, hedged once fewer remain
    n_gated = sum(r.gated for r in levers_trace_rows(lines))
    assert engine.stats.gated_rounds == n_gated and engine.stats.hedged_rounds <= engine.stats.rounds - n_gated
    for prompt, budget, out in zip(PROMPTS, BUDGETS, outs, strict=True):
        assert out.token_ids == plain[tuple(prompt)][:budget]


def test_trim_limits_branch_positions(tiny_target, dspark, plain, capsys):
    # k = 2: the chain at position 2 can never be verified; spans stay 1 + 2 for main and chains.
    engine = hedged_engine(tiny_target, dspark, plain, 1, [], max_drafts=2)
    outs = engine.generate(PROMPTS, [SamplingParams(temperature=0, max_tokens=b, ignore_eos=True) for b in BUDGETS])
    lines = capsys.readouterr().err.splitlines()
    assert max(r.verified_draft for r in levers_trace_rows(lines)) == 2
    hedges = hedge_trace_rows(lines)
    assert hedges and max(h.chains for h in hedges) == 2 and any(h.winner == 2 for h in hedges)
    for prompt, budget, out in zip(PROMPTS, BUDGETS, outs, strict=True):
        assert out.token_ids == plain[tuple(prompt)][:budget]


@pytest.mark.parametrize(
    "levers",
    [
        {},
        {"max_drafts": 3},
        {"hedge_knee": 12},
        {"hedge_auto": True},
        {"max_batch": 3, "hedge_positions": (0, 2, 4, 9)},
    ],
    ids=["plain-hedge", "trim3", "knee12", "auto", "gate3-positions"],
)
def test_real_markov_drafter_hedged_is_lossless(tiny_target, dspark, plain, levers, capsys):
    cfg = {"hedge": 8, "hedge_positions": POSITIONS, **levers}
    engine = Engine(EngineConfig(model=str(tiny_target), draft_model=str(dspark), device="cpu", trace=True, levers=cfg))
    params = [SamplingParams(temperature=0, max_tokens=b, ignore_eos=True) for b in BUDGETS]
    outs = engine.generate(PROMPTS, params)
    for prompt, budget, out in zip(PROMPTS, BUDGETS, outs, strict=True):
        assert out.token_ids == plain[tuple(prompt)][:budget]
    hedges = hedge_trace_rows(capsys.readouterr().err.splitlines())
    if "hedge_knee" in levers:  # 12 rows at span 6: two groups, so one chain and only at batch 1
        assert hedges and all(h.chains == 1 for h in hedges)
    elif not levers.get("hedge_auto"):
        assert engine.stats.hedge_chains > 0


def test_sampled_requests_are_not_hedged(tiny_target, dspark, plain, capsys):
    engine = Engine(
        EngineConfig(
            model=str(tiny_target),
            draft_model=str(dspark),
            device="cpu",
            trace=True,
            levers={"hedge": 8, "hedge_positions": POSITIONS},
        )
    )
    params = [SamplingParams(temperature=0, max_tokens=b, ignore_eos=True) for b in BUDGETS]
    params[2] = SamplingParams(max_tokens=BUDGETS[2], ignore_eos=True, temperature=0.8, seed=3)
    outs = engine.generate(PROMPTS, params)
    hedged = {h.request for h in hedge_trace_rows(capsys.readouterr().err.splitlines())}
    assert hedged and 2 not in hedged
    for i, (prompt, budget, out) in enumerate(zip(PROMPTS, BUDGETS, outs, strict=True)):
        if i != 2:
            assert out.token_ids == plain[tuple(prompt)][:budget]


def test_fixture_dspark_pair_hedged_is_lossless_with_wins_and_discards(capsys):
    from engine.shipped import shipped_dspark, shipped_pair, shipped_prompts

    dspark = shipped_dspark("tiny")
    if not (dspark / "config.json").is_file():
        pytest.skip("the fixture's drafter-dspark is not built (python -m engine.fixture markov)")
    target = shipped_pair("tiny")[0]
    texts = [json.loads(line)["text"] for line in shipped_prompts("tiny").read_text().splitlines()[:4]]
    plain = Engine(EngineConfig(model=str(target), device="cpu"))
    spec = Engine(
        EngineConfig(
            model=str(target),
            draft_model=str(dspark),
            device="cpu",
            trace=True,
            levers={"hedge": 8, "hedge_positions": POSITIONS},
        )
    )
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    want = [o.token_ids for o in plain.generate(texts, params)]
    assert [o.token_ids for o in spec.generate(texts, params)] == want
    s = summarize_hedge(hedge_trace_rows(capsys.readouterr().err.splitlines()))
    assert s.wins > 0 and s.discards > 0
