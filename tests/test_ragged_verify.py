"""The ragged verify (engine/ragged.py): 1 + K_i rows per request in one forward. Uniform spans through
it match the uniform verify bit for bit; each request of a mixed round gets the logits, greedy targets
and accept row its own uniform verify gives it (batch-invariant numerics: rows are span-invariant)."""

from __future__ import annotations

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.kernels.span_meta import ragged_layout, ragged_spans
from engine.ragged import ragged_verify

PROMPTS = [[5, 6, 7, 8, 9, 10], [1, 2, 3], list(range(20, 60))]


def _prefilled(tiny_target, tiny_drafter):
    engine = Engine(
        EngineConfig(model=str(tiny_target), draft_model=str(tiny_drafter), device="cpu", batch_invariant=True)
    )
    for prompt in PROMPTS:
        engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    engine.step()  # the prefill
    return engine, list(engine.scheduler.running)


def _uniform(engine, reqs, drafts, k, limits):
    runner = engine.runner
    runner.stage(reqs, limits)
    res, rows = runner.verify(reqs, drafts, k, engine.rounds.accept)
    return res.logits.clone(), res.greedy.clone(), rows.clone()


def test_uniform_spans_through_the_ragged_verify_are_the_uniform_verify(tiny_target, tiny_drafter):
    engine, reqs = _prefilled(tiny_target, tiny_drafter)
    runner, k = engine.runner, 3
    runner.stage(reqs)
    drafts = runner.draft(reqs).clone()
    logits, greedy, rows = _uniform(engine, reqs, drafts, k, [k] * 3)
    runner.stage(reqs, [k] * 3)
    (r_logits, r_greedy, _), r_rows, starts = ragged_verify(runner, reqs, drafts, [k] * 3, engine.rounds.accept)
    assert starts == [0, 4, 8]
    assert torch.equal(r_logits, logits) and torch.equal(r_greedy, greedy)
    assert r_rows[:, 0].tolist() == rows[:, 0].tolist()


@pytest.mark.parametrize("ks", [[0, 2, 5], [4, 0, 1], [5, 5, 0]])
def test_each_request_of_a_mixed_round_gets_its_own_verify(tiny_target, tiny_drafter, ks):
    engine, reqs = _prefilled(tiny_target, tiny_drafter)
    runner = engine.runner
    runner.stage(reqs)
    drafts = runner.draft(reqs).clone()
    runner.stage(reqs, ks)
    (logits, greedy, _), rows, starts = ragged_verify(runner, reqs, drafts, ks, engine.rounds.accept)
    logits, greedy, rows = logits.clone(), greedy.clone(), rows.tolist()
    assert logits.shape[0] == sum(1 + k for k in ks)
    for i, (r, k) in enumerate(zip(reqs, ks, strict=True)):
        alone, span = _uniform(engine, [r], drafts[i : i + 1], k, [k]), slice(starts[i], starts[i] + 1 + k)
        assert torch.equal(logits[span], alone[0]) and torch.equal(greedy[span], alone[1])
        n = alone[2][0, 0].item()
        assert rows[i][0] == n and rows[i][1 + runner.drafter.cfg.drafts_per_round + n] == alone[2][0, 1 + k + n]


def test_the_layout_pads_rows_into_no_sequence():
    layout = ragged_layout([2, 0], [10, 4], [0, 1], width=4, m=4, rows=12, null_row=9)
    rows = 12
    src, pos, tab = layout[: 3 * rows].reshape(3, rows)
    assert src[:4].tolist() == [0, 1, 2, 4] and pos[:4].tolist() == [10, 11, 12, 4]
    assert (pos[4:] == -1).all() and (tab[4:] == 9).all()
    inv = layout[3 * rows : 3 * rows + 16].reshape(4, 4)
    assert inv[0].tolist() == [0, 1, 2, 2] and inv[1].tolist() == [3, 3, 3, 3]
    seq_tab, seq_lens = layout[3 * rows + 16 : 3 * rows + 24].reshape(2, 4)
    assert seq_tab.tolist() == [0, 1, 9, 9] and seq_lens.tolist() == [13, 5, 0, 0]
    assert layout[3 * rows + 24 :].tolist() == [0, 3, 4, 4, 4]


def test_ragged_spans_are_the_uniform_variants():
    assert ragged_spans(16) == [2, 3, 5, 9, 17] and ragged_spans(7) == [2, 3, 5, 8] and ragged_spans(1) == [2]
