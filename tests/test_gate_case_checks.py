"""The levers gate's trace checks per case: recorded real traces pass, each planted fault fails by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from gates.cases import ALL_CASES, CASES, Expect
from gates.checks import check_case
from trace_tools import gated_hedges, hedge_trace_rows, levers_trace_rows, unresumed_requests

DATA = Path(__file__).resolve().parent / "data" / "trace"
CASE = {c.id: c for c in CASES}


def rnd(req: int, gated: int, verified: int, accepted: int) -> str:
    return (
        f"[DEBUG] DFlash round request=req-{req} gated={gated} verified_draft={verified} "
        f"accepted_draft={accepted} committed_tokens={accepted + 1}"
    )


def gated_phase(requests: range, rounds: int) -> list[str]:
    return [rnd(r, 1, 0, 0) for _ in range(rounds) for r in requests]


def problems(case_id: str, lines: list[str]) -> list[str]:
    return check_case(CASE[case_id], levers_trace_rows(lines))


def sample(name: str) -> list[str]:
    return (DATA / name).read_text().splitlines()


# ---- good traces pass (so the faults below are what trips the checks) ----

GOOD = {
    "greedy-MAX_BATCH=1": gated_phase(range(1), 5) + gated_phase(range(1, 2), 5),
    "greedy-MAX_DRAFTS=4": sample("greedy-max-drafts-4.log"),
    "concurrent-MAX_DRAFTS=2": [rnd(r, 0, 2, a) for r, a in [(0, 2), (1, 0), (2, 1), (3, 2), (0, 1)]]
    + [rnd(1, 0, 1, 1)],
    "concurrent-MAX_BATCH=3": sample("concurrent-max-batch-3.log"),
}


@pytest.mark.parametrize("case_id", GOOD)
def test_a_trace_that_shows_the_case_passes(case_id):
    assert problems(case_id, GOOD[case_id]) == []


def test_a_request_that_finishes_while_gated_is_not_a_latch():
    # Under a 4 -> 3 shrink the shortest budget ends inside the gated phase; the sample shows it.
    rows = levers_trace_rows(GOOD["concurrent-MAX_BATCH=3"])
    assert unresumed_requests(rows) != []
    assert check_case(CASE["concurrent-MAX_BATCH=3"], rows) == []


# ---- planted faults ----


def test_trim_that_verifies_k_plus_one_drafts_fails():
    lines = [rnd(0, 0, 4, 2), rnd(0, 0, 5, 1), rnd(0, 0, 4, 4)]
    assert any("more than 4 drafts (up to 5)" in p for p in problems("greedy-MAX_DRAFTS=4", lines))


def test_trim_that_never_verifies_exactly_k_is_vacuous():
    lines = [rnd(0, 0, 1, 1), rnd(1, 0, 1, 0), rnd(0, 0, 0, 0)]
    assert any("no round verified exactly 2" in p for p in problems("concurrent-MAX_DRAFTS=2", lines))


def test_gated_row_under_max_drafts_fails():
    lines = [rnd(0, 0, 4, 2), rnd(1, 1, 0, 0), rnd(0, 0, 4, 1)]
    assert any("1 gated rounds" in p for p in problems("concurrent-MAX_DRAFTS=4", lines))


def test_max_batch_1_with_one_speculating_row_fails():
    lines = gated_phase(range(1), 5) + [rnd(0, 0, 4, 3)]
    assert any("1 speculating rounds" in p and "req-0" in p for p in problems("greedy-MAX_BATCH=1", lines))


def test_max_batch_1_that_never_gates_fails():
    # e.g. a gate that trips only above the batch while the child runs one request at a time
    lines = [rnd(0, 0, 7, 3), rnd(0, 0, 7, 7)]
    found = problems("greedy-MAX_BATCH=1", lines)
    assert any("no gated round" in p for p in found) and any("2 speculating rounds" in p for p in found)


def test_gate_that_latches_to_plain_decode_fails():
    # Gated rounds, then plain decode: no round line for those requests ever again.
    found = problems("concurrent-MAX_BATCH=3", gated_phase(range(4), 20))
    assert any("the gate latches" in p for p in found)
    assert any("never resumed" in p for p in found)


def test_latch_is_checked_per_request_id():
    # Speculation that "resumes" only for a request admitted after the gate is not a resume.
    lines = gated_phase(range(4), 20) + [rnd(4, 0, 7, 3), rnd(4, 0, 7, 5)]
    found = problems("concurrent-MAX_BATCH=3", lines)
    assert any("req-0, req-1, req-2, req-3" in p and "latches" in p for p in found)


def test_resume_whose_later_rounds_verify_but_accept_nothing_fails():
    lines = gated_phase(range(4), 3) + [rnd(r, 0, 7, 0) for _ in range(5) for r in (0, 2, 3)]
    found = problems("concurrent-MAX_BATCH=3", lines)
    assert any("latches" in p for p in found)
    assert any("req-0, req-2, req-3 verified drafts again" in p for p in found)


def test_one_resumed_request_does_not_excuse_another_that_accepts_nothing():
    lines = gated_phase(range(4), 3) + [rnd(0, 0, 7, 4), rnd(2, 0, 7, 0), rnd(0, 0, 7, 2), rnd(2, 0, 7, 0)]
    found = problems("concurrent-MAX_BATCH=3", lines)
    assert found == ["req-2 verified drafts again after being gated but never accepted one"]


def test_a_resume_with_no_draft_left_to_verify_is_no_chance_to_accept():
    # req-1's budget ends one token after the gate lifts: its one speculative round verifies nothing.
    lines = gated_phase(range(4), 3) + [rnd(0, 0, 7, 4), rnd(1, 0, 0, 0), rnd(0, 0, 7, 2)]
    assert problems("concurrent-MAX_BATCH=3", lines) == []


# ---- the cases and the child command ----


def test_the_cases_of_the_spec_in_order_then_the_stop_case():
    assert [c.id for c in CASES] == [
        "greedy-MAX_BATCH=1",
        "greedy-MAX_DRAFTS=4",
        "concurrent-MAX_DRAFTS=4",
        "greedy-MAX_DRAFTS=2",
        "concurrent-MAX_DRAFTS=2",
        "concurrent-MAX_BATCH=3",
        "stop-default-levers",
        "concurrent-POLICY=adaptive-COST_TABLE=gates/data/adaptive-loss.csv",
    ]
    adaptive = CASE["concurrent-POLICY=adaptive-COST_TABLE=gates/data/adaptive-loss.csv"]
    assert adaptive.env == {
        "PEGAINFER_SPEC_POLICY": "adaptive",
        "PEGAINFER_SPEC_COST_TABLE": "gates/data/adaptive-loss.csv",
    }
    assert CASE["concurrent-MAX_BATCH=3"].nodeid == "gates/test_lossless.py::test_concurrent_heterogeneous_is_lossless"
    assert CASE["stop-default-levers"].env == {}
    hedged = [c for c in ALL_CASES if c.expect.hedged]
    assert [c.id for c in hedged] == [
        "greedy-HEDGE=8-HEDGE_POSITIONS=0,1,2",
        "concurrent-HEDGE=8-HEDGE_POSITIONS=0,1,2-MAX_BATCH=3",
        "arrivals-HEDGE=8-HEDGE_POSITIONS=0,1,2-HEDGE_AUTO=1-MAX_BATCH=3",
        "concurrent-HEDGE=8-HEDGE_POSITIONS=0,1,2-POLICY=budget-COST_TABLE=gates/data/budget-mixed.csv-MAX_DRAFTS=4",
    ]
    assert hedged[1].env == {
        "PEGAINFER_SPEC_HEDGE": "8",
        "PEGAINFER_SPEC_HEDGE_POSITIONS": "0,1,2",
        "PEGAINFER_SPEC_MAX_BATCH": "3",
    }


# ---- stop tokens ----


def stop_rnd(req: int, verified: int, accepted: int, committed: int) -> str:
    return (
        f"[DEBUG] DFlash round request=req-{req} gated=0 verified_draft={verified} "
        f"accepted_draft={accepted} committed_tokens={committed}"
    )


def test_stop_case_needs_a_stop_inside_an_accepted_run():
    case = CASE["stop-default-levers"]
    inside = [stop_rnd(0, 7, 3, 4), stop_rnd(0, 7, 5, 2)]  # the last round stops on its 2nd token
    assert check_case(case, levers_trace_rows(inside)) == []
    on_bonus = [stop_rnd(0, 7, 3, 4), stop_rnd(1, 7, 0, 1)]
    assert check_case(case, levers_trace_rows(on_bonus)) == [
        "no round ended on a stop token inside its accepted drafts: the stop path was never exercised"
    ]
    gated = [*inside, "[DEBUG] DFlash round request=req-1 gated=1 verified_draft=0 accepted_draft=0 committed_tokens=1"]
    assert any("1 gated rounds" in p for p in check_case(case, levers_trace_rows(gated)))


# ---- hedging under the batch gate ----

HEDGED_GATE = next(c for c in ALL_CASES if c.expect is Expect.HEDGE_GATED)


def hedge_line(req: int, chains: int = 3) -> str:
    return f"[DEBUG] DFlash hedge request=req-{req} chains={chains} winner=0 main_accepted=2 best_accepted=2"


def hedge_problems(lines: list[str]) -> list[str]:
    return check_case(HEDGED_GATE, levers_trace_rows(lines), hedge_trace_rows(lines), gated_hedges(lines))


def test_hedge_under_the_gate_passes_when_chains_run_in_speculating_rounds_only():
    lines = [rnd(0, 1, 0, 0), rnd(1, 1, 0, 0), rnd(0, 0, 7, 2), hedge_line(0), rnd(1, 0, 7, 3)]
    assert hedge_problems(lines) == []


def test_a_chain_verified_in_a_gated_round_fails():
    lines = [rnd(0, 0, 7, 2), hedge_line(0), rnd(1, 1, 0, 0), hedge_line(1), rnd(1, 0, 7, 1)]
    assert hedge_problems(lines) == ["req-1 verified hedge chains in a gated round, which has no drafts"]


def test_hedge_under_the_gate_must_gate_and_hedge():
    found = hedge_problems([rnd(0, 0, 7, 2), rnd(1, 0, 7, 3)])
    assert any("no gated round" in p for p in found) and any("no hedge chain verified" in p for p in found)


# ---- the adaptive policy under MAX_DRAFTS ----

CAPPED = next(c for c in ALL_CASES if c.expect is Expect.CAPPED)


def _capped(verified: int, span_limit: int) -> str:
    return rnd(0, 0, verified, 1) + f" span_limit={span_limit}"


def test_capped_needs_every_k_within_the_cap_and_some_round_at_it():
    assert CAPPED.knob_value("MAX_DRAFTS") == "4"
    good = [rnd(0, 1, 0, 0), _capped(4, 4), _capped(2, 4)]
    assert check_case(CAPPED, levers_trace_rows(good)) == []
    over = check_case(CAPPED, levers_trace_rows([rnd(0, 1, 0, 0), _capped(4, 4), _capped(3, 7)]))
    assert over == ["1 rounds chose K above MAX_DRAFTS=4 (up to 7): the cap does not bound K"]
    never = check_case(CAPPED, levers_trace_rows([rnd(0, 1, 0, 0), _capped(2, 2)]))
    assert never == ["no round verified exactly 4 drafts: the cap never bound the policy"]
    ungated = check_case(CAPPED, levers_trace_rows([_capped(4, 4)]))
    assert ungated == ["0 gated and 1 speculating rounds: the policy never moved K"]


# ---- spans per request (policy=budget) ----

RAGGED = next(c for c in ALL_CASES if c.expect is Expect.RAGGED)


def _ragged(req: int, verified: int, accepted: int, span_limit: int) -> str:
    return rnd(req, 0, verified, accepted) + f" span_limit={span_limit}"


def test_ragged_needs_a_mixed_round_every_k_within_the_cap_and_a_resume():
    gated = [rnd(0, 1, 0, 0), rnd(1, 1, 0, 0)]
    mixed = [_ragged(0, 4, 3, 4), _ragged(1, 1, 1, 1)]
    assert check_case(RAGGED, levers_trace_rows(gated + mixed)) == []
    uniform = check_case(RAGGED, levers_trace_rows([*gated, _ragged(0, 4, 3, 4), _ragged(1, 4, 1, 4)]))
    assert uniform == ["no round verified different K for its requests: the per-request spans never mixed"]
    # the same K values in consecutive rounds of one request are not a mixed round
    apart = check_case(RAGGED, levers_trace_rows([*gated, _ragged(0, 4, 3, 4), _ragged(0, 1, 1, 1)]))
    assert any("never mixed" in p for p in apart)
    over = check_case(RAGGED, levers_trace_rows([*gated, _ragged(0, 4, 3, 4), _ragged(1, 5, 1, 6)]))
    assert over == ["1 rounds chose K above MAX_DRAFTS=4 (up to 6): the cap does not bound K"]
    stalled = check_case(RAGGED, levers_trace_rows([*gated, _ragged(0, 4, 3, 4), _ragged(1, 1, 0, 1)]))
    assert stalled == ["req-1 verified drafts again after being gated but never accepted one"]


# ---- hedging under policy=budget ----

HEDGED_BUDGET = next(c for c in ALL_CASES if c.expect is Expect.HEDGE_BUDGET)


def test_hedged_budget_needs_chains_and_every_request_within_its_bounds():
    assert HEDGED_BUDGET.knob_value("MAX_DRAFTS") == "4" and HEDGED_BUDGET.knob_value("POLICY") == "budget"
    won = hedge_line(0).replace("winner=0 main_accepted=2", "winner=1 main_accepted=1")

    def found(lines):
        return check_case(HEDGED_BUDGET, levers_trace_rows(lines), hedge_trace_rows(lines), gated_hedges(lines))

    good = [rnd(1, 1, 0, 0), _ragged(0, 4, 2, 4), won, _ragged(1, 2, 1, 3)]
    assert found(good) == []
    assert found([_ragged(0, 4, 2, 4), _ragged(1, 2, 1, 3)])[0].startswith("no hedge chain verified")
    over = found([_ragged(0, 4, 2, 4), won, _ragged(1, 5, 1, 5)])
    assert over == ["1 request-rounds past their bounds (e.g. req-1: verified 5 of K_i 5, MAX_DRAFTS=4)"]
    past = found([_ragged(0, 4, 2, 4), won, _ragged(1, 3, 1, 2)])
    assert past == ["1 request-rounds past their bounds (e.g. req-1: verified 3 of K_i 2, MAX_DRAFTS=4)"]
