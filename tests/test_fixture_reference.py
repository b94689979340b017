"""The reference speculative loop on a micro pair: lossless against plain greedy, exact budgets,
and the drafter context is always the features of the committed tokens."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine.fixture.features import tap
from engine.fixture.recipes import MICRO
from engine.fixture.reference import (
    acceptance_by_position,
    ngram_generate,
    ngram_propose,
    plain_generate,
    reference_generate,
)
from engine.fixture.train_drafter import make_drafter
from engine.fixture.train_target import make_target

# A small vocab makes random-weight drafts match the target now and then, so acceptance paths run.
R = dataclasses.replace(MICRO, vocab_size=24)


@pytest.fixture(scope="module")
def pair():
    target = make_target(R, eos_id=0, seed=3).eval()
    drafter = make_drafter(R, 1, target, seed=4).eval()
    return target, drafter


def prompts(n: int = 6) -> list[list[int]]:
    gen = torch.Generator().manual_seed(7)
    return [torch.randint(2, R.vocab_size, (int(5 + 3 * i),), generator=gen).tolist() for i in range(n)]


@pytest.mark.parametrize("block_size", [None, 2, 3])
def test_speculative_equals_plain_greedy(pair, block_size):
    target, drafter = pair
    for p in prompts():
        for budget in (1, 2, 7, 20):
            ref = plain_generate(target, p, budget)
            res = reference_generate(target, drafter, p, budget, block_size=block_size)
            assert res.tokens == ref, (p, budget)
            assert len(res.tokens) == budget
            # every round commits accepted + 1 (the bonus); the prefill token is not a round
            assert sum(r.committed for r in res.rounds) == budget - 1
            assert all(r.committed == r.accepted + 1 and r.accepted <= r.verified for r in res.rounds)


def test_oracle_drafter_exact_acceptance(pair, monkeypatch):
    """A drafter forced to draft the target's true continuation with one wrong token at a chosen
    row: every round accepts exactly the drafts before that row (or all when none is wrong), and
    the output stays the plain greedy one."""
    target, drafter = pair
    B = drafter.cfg.block_size
    W = target.get_output_embeddings().weight.detach()
    pinv = torch.linalg.pinv(W)  # [H, V]: W @ (pinv @ y) == y while V <= H
    assert W.shape[0] <= W.shape[1]
    p = prompts()[1]
    budget = 30
    truth = plain_generate(target, p, budget + B)
    wrong_row: list[int] = []

    def oracle(block_hidden, ctx, block_pos, ctx_pos, mask=None):
        s = int(block_pos[0, 0])
        want = [truth[s + k - len(p)] for k in range(B)]
        j = len(wrong_row) % B  # 0 = no wrong draft this round, else the row to corrupt
        if j:
            want[j] = (want[j] + 1) % W.shape[0]
        wrong_row.append(j)
        y = torch.nn.functional.one_hot(torch.tensor(want), W.shape[0]).float() * 50.0
        return (y @ pinv.T)[None]

    monkeypatch.setattr(drafter, "forward", oracle)
    res = reference_generate(target, drafter, p, budget)
    assert res.tokens == truth[:budget]
    for j, rnd in zip(wrong_row, res.rounds, strict=True):
        expect = rnd.verified if j == 0 else min(j - 1, rnd.verified)
        assert rnd.accepted == expect, (j, rnd)
    assert max(r.accepted for r in res.rounds) == B - 1


def test_ngram_equals_plain_greedy(pair):
    target, _ = pair
    accepted = 0
    for p in prompts():
        res = ngram_generate(target, p, 24, num_drafts=3)
        assert res.tokens == plain_generate(target, p, 24)
        accepted += sum(r.accepted for r in res.rounds)
    assert accepted > 0


class Recording:
    """The drafter with each forward call's inputs recorded: a wrapper, not a patched method, so it
    sees every call on any device."""

    def __init__(self, drafter) -> None:
        self.drafter, self.calls = drafter, []

    def __getattr__(self, name: str):
        return getattr(self.drafter, name)

    def __call__(self, block_hidden, ctx, block_pos, ctx_pos, mask=None):
        self.calls.append((ctx.clone(), block_pos.clone(), ctx_pos.clone(), mask))
        return self.drafter(block_hidden, ctx, block_pos, ctx_pos, mask)


def test_drafter_context_is_committed_features(pair):
    """Each draft call sees exactly project_context(features of every committed token but the
    anchor), recomputed here from scratch, and a block at positions s..s+B-1."""
    target, drafter = pair
    p = prompts()[2]
    spy = Recording(drafter)
    res = reference_generate(target, spy, p, 16)
    assert len(spy.calls) == len(res.rounds) > 0
    committed = len(p) + 1
    B = drafter.cfg.block_size
    with torch.no_grad():
        for (ctx, block_pos, ctx_pos, mask), rnd in zip(spy.calls, res.rounds, strict=True):
            seq = (p + res.tokens)[: committed - 1]  # everything before the anchor
            ids = torch.tensor([seq], device=ctx.device)
            hs = target(input_ids=ids, output_hidden_states=True).hidden_states
            want = drafter.project_context(tap(hs, drafter.cfg.target_layer_ids))
            s = len(seq)
            torch.testing.assert_close(ctx, want, rtol=1e-4, atol=1e-4)
            assert block_pos.tolist() == [list(range(s, s + B))]
            assert ctx_pos.tolist() == [list(range(s))]
            assert mask is None
            committed += rnd.committed


def test_eos_stops(pair):
    target, drafter = pair
    p = prompts()[0]
    ref = plain_generate(target, p, 20)
    eos = ref[5]
    want = ref[: ref.index(eos) + 1]
    assert plain_generate(target, p, 20, eos_token_id=eos) == want
    assert reference_generate(target, drafter, p, 20, eos_token_id=eos).tokens == want
    assert ngram_generate(target, p, 20, 3, eos_token_id=eos).tokens == want


def test_ngram_propose():
    assert ngram_propose([1, 2, 3, 9, 9, 1, 2, 3], 2) == [9, 9]
    assert ngram_propose([5, 1, 2, 7, 1, 2], 3) == [7, 1, 2]  # most recent longest match
    assert ngram_propose([4, 8, 6, 4], 3) == [8, 6, 4]  # falls back to a 1-gram
    assert ngram_propose([1, 2, 3], 3) == []


def test_acceptance_by_position():
    from engine.fixture.reference import Round

    rounds = [Round(3, 3, 4), Round(3, 1, 2), Round(1, 0, 1)]
    assert acceptance_by_position(rounds, 3) == [2 / 3, 1 / 2, 1 / 2]
