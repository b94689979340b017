"""A time budget shortens a cost profile but never leaves it without the rows its users need
(engine/policy/calibration.py `time_forwards`): the required spans' verify and drafter rows at every
batch whatever the budget, and only whole (kind, span) groups cut, so no span is measured at some
batches and missing at others (the study's calibration interpolates over batch)."""

from __future__ import annotations

from engine import Engine, EngineConfig
from engine.policy.calibration import time_forwards
from engine.policy.warmup import dummy_requests

BATCHES, SPANS = [1, 2], [1, 3, 5]


def profile(target, drafter, budget_s: float | None, required=(1, 3)) -> tuple[set, int]:
    e = Engine(EngineConfig(model=str(target), draft_model=str(drafter), device="cpu", max_num_seqs=2))
    with dummy_requests(e, max(BATCHES), 8, max(SPANS) + 1) as reqs:
        rows = time_forwards(e.runner, e.rounds.accept, reqs, BATCHES, SPANS, 1, 1, budget_s, 0, required)
    return {(r["kind"], r["span"], r["batch"]) for r in rows}, e.drafts_per_round


def groups_whole(got: set) -> bool:
    return all({b for k, s, b in got if (k, s) == group} == set(BATCHES) for group in {(k, s) for k, s, _ in got})


def test_a_spent_budget_still_measures_the_required_spans_at_every_batch(tiny_target, tiny_drafter, one_thread):
    got, per_round = profile(tiny_target, tiny_drafter, 0.0)
    need = {("verify", s, b) for s in (1, 3) for b in BATCHES}
    need |= {("draft", k, b) for k in (per_round, 2) for b in BATCHES}  # the full drafter and K=2's head
    assert need <= got and groups_whole(got)
    assert not any(k == "verify" and s == 5 for k, s, _ in got)  # the optional span: cut whole


def test_without_a_budget_every_point_is_measured(tiny_target, tiny_drafter, one_thread):
    got, per_round = profile(tiny_target, tiny_drafter, None, required=(1,))
    want = {("verify", s, b) for s in SPANS for b in BATCHES}
    want |= {("draft", k, b) for k in (per_round, 2, 4) for b in BATCHES if k <= per_round}
    assert want == got and groups_whole(got)
