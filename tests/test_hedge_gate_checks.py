"""The levers gate's hedge case: its checks fail on planted faults, its child gets the Markov drafter
(and no other child does), its row reaches the run record, and a missing drafter is a skip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gates.cases import (
    ALL_CASES,
    CAPTURE_CASES,
    CASES,
    COMBO_CASES,
    HEDGE_CASES,
    HEDGE_DRAFTER_ENV,
    KNOWN_CASES,
    PENALTY_CASES,
    RAGGED_CASES,
    Expect,
)
from gates.checks import check_case
from gates.child import child_spec
from gates.verdict import check_child, gate_line
from gates.weights import GateWeights, hedge_drafter, resolve_gate_weights
from tests.checkpoints import make_drafter, make_dspark_drafter
from tests.gate_traces import complete
from trace_tools import RecordHeader, RecordRow, hedge_trace_rows, levers_trace_rows, render_record

HEDGE = HEDGE_CASES[0]


def rnd(req: int, accepted: int, gated: int = 0, verified: int = 7) -> str:
    return (
        f"[DEBUG] DFlash round request=req-{req} gated={gated} verified_draft={verified} "
        f"accepted_draft={accepted} committed_tokens={accepted + 1}"
    )


def hdg(req: int, chains: int, winner: int, main: int, best: int | None = None) -> str:
    best = main if best is None else best
    return (
        f"[DEBUG] DFlash hedge request=req-{req} chains={chains} winner={winner} "
        f"main_accepted={main} best_accepted={best}"
    )


GOOD = [rnd(0, 3), hdg(0, 3, 0, 3), rnd(0, 4), hdg(0, 3, 2, 1, 4), rnd(1, 7), hdg(1, 3, 0, 7), rnd(1, 0)]


def problems(lines: list[str]) -> list[str]:
    return check_case(HEDGE, levers_trace_rows(lines), hedge_trace_rows(lines))


def test_the_hedge_case():
    assert HEDGE.id == "greedy-HEDGE=8-HEDGE_POSITIONS=0,1,2"
    assert HEDGE.env_label == "HEDGE=8 HEDGE_POSITIONS=0,1,2"
    assert HEDGE.env == {"PEGAINFER_SPEC_HEDGE": "8", "PEGAINFER_SPEC_HEDGE_POSITIONS": "0,1,2"}
    assert HEDGE.expect is Expect.HEDGE and HEDGE.child == "test_greedy_matches_plain_greedy"
    assert ALL_CASES == CASES + COMBO_CASES + PENALTY_CASES + CAPTURE_CASES + HEDGE_CASES + KNOWN_CASES + RAGGED_CASES
    assert len(CASES) == 8 and len(HEDGE_CASES) == 4
    budget = [c for c in HEDGE_CASES if ("POLICY", "budget") in c.extra]  # hedging under per-request spans
    assert len(budget) == 1 and budget[0].knob == "HEDGE" and budget[0].expect is Expect.HEDGE_BUDGET


def test_a_trace_with_wins_and_discards_passes():
    assert problems(GOOD) == []


def test_no_chain_verified_fails():
    found = problems([rnd(0, 3), rnd(0, 1)])
    assert any("no hedge chain verified" in p for p in found)


def test_no_win_fails():
    found = problems([rnd(0, 3), hdg(0, 3, 0, 3), hdg(1, 1, 0, 0)])
    assert found == ["no chain won in 2 hedged rounds: the win path never ran"]


def test_no_discard_fails():
    found = problems([rnd(0, 3), hdg(0, 1, 1, 0, 2), hdg(1, 1, 1, 1, 3)])
    assert found == ["every one of 2 chains won: the discard path never ran"]


def test_gated_rounds_under_the_hedge_alone_fail():
    assert any("gated rounds" in p for p in problems([*GOOD, rnd(2, 0, gated=1, verified=0)]))


def test_child_result_carries_hedge_counts_into_the_row_and_gate_line():
    result = check_child(HEDGE, 0, "\n".join(complete(GOOD)))
    assert result.problems == ()
    row = result.row
    assert (row.hedge_chains, row.hedge_wins, row.env) == (9, 1, "HEDGE=8 HEDGE_POSITIONS=0,1,2")
    assert gate_line(row).endswith("max_drafts=7 hedge_chains=9 hedge_wins=1 compared_tokens=20 excused=0")
    assert check_child(HEDGE, 1, "\n".join(complete(GOOD))).problems == (
        "the child exited 1: its lossless assertions or its setup failed",
    )
    other = check_child(CASES[1], 0, "\n".join(complete([rnd(0, 4, verified=4)]))).row
    assert other.hedge_chains is None and "hedge" not in gate_line(other)


def test_unreadable_hedge_line_is_a_problem_not_a_crash():
    found = check_child(HEDGE, 0, "\n".join(complete([*GOOD, hdg(0, 1, 1, 2, 2)]))).problems
    assert len(found) == 1 and found[0].startswith("unreadable trace:")


def test_record_gets_a_hedge_column_only_with_a_hedge_row():
    header = RecordHeader("abc", "cpu (x86_64)", "fixture:tiny", "2026-12-01T00:00:00Z", "pytest gates/", 2, 9)
    plain = RecordRow("test_greedy_matches_plain_greedy", "MAX_BATCH=1", 5, 0, None, 320, 0, True)
    assert "hedge" not in render_record(header, [plain])
    hedged = RecordRow("test_greedy_matches_plain_greedy", HEDGE.env_label, 0, 60, 7, 320, 0, True, 40, 6)
    text = render_record(header, [plain, hedged])
    assert "| verdict | hedge chains / wins |" in text
    assert "| MAX_BATCH=1 | 5 | 0 | - | 320 | 0 | pass | - |" in text
    assert "| HEDGE=8 HEDGE_POSITIONS=0,1,2 | 0 | 60 | 7 | 320 | 0 | pass | 40 / 6 |" in text


def test_only_the_hedge_child_gets_the_markov_drafter():
    base = {"PATH": "/bin", HEDGE_DRAFTER_ENV: "/user/dspark", "PEGAINFER_SPEC_HEDGE_AUTO": "1"}
    hedge = child_spec(HEDGE, base, python="/py", extra_env={HEDGE_DRAFTER_ENV: "/gate/dspark"})
    assert hedge.env == {
        "PATH": "/bin",
        "PEGAINFER_SPEC_HEDGE": "8",
        "PEGAINFER_SPEC_HEDGE_POSITIONS": "0,1,2",
        HEDGE_DRAFTER_ENV: "/gate/dspark",
        "PEGAINFER_TEST_LOG": "1",
        "PYTHONUNBUFFERED": "1",
    }
    gated_hedge = child_spec(HEDGE_CASES[1], base, python="/py", extra_env={HEDGE_DRAFTER_ENV: "/gate/dspark"})
    assert gated_hedge.env["PEGAINFER_SPEC_MAX_BATCH"] == "3" and gated_hedge.env[HEDGE_DRAFTER_ENV] == "/gate/dspark"
    for case in CASES:
        spec = child_spec(case, base, python="/py")
        assert HEDGE_DRAFTER_ENV not in spec.env and HEDGE_DRAFTER_ENV in spec.env_removed
        assert not any(k.startswith("PEGAINFER_SPEC_HEDGE") for k in spec.env)


@pytest.fixture
def clean_weights_env(monkeypatch):
    for name in ("PEGAINFER_TEST_MODEL_PATH", "PEGAINFER_DFLASH_TEST_MODEL_PATH", HEDGE_DRAFTER_ENV):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_hedge_drafter_resolution(tmp_path: Path, clean_weights_env):
    fixture = GateWeights("t", "d", "fixture:tiny")
    external = GateWeights("/w/t", "/w/d", "/w/t + /w/d")
    chosen, reason = hedge_drafter(external)
    assert chosen is None and HEDGE_DRAFTER_ENV in reason
    dspark, plain = tmp_path / "dspark", tmp_path / "plain"
    make_dspark_drafter(dspark, layout="zlab")
    make_drafter(plain)
    clean_weights_env.setenv(HEDGE_DRAFTER_ENV, str(plain))
    chosen, reason = hedge_drafter(fixture)
    assert chosen is None and "no Markov head" in reason
    clean_weights_env.setenv(HEDGE_DRAFTER_ENV, str(dspark))
    assert hedge_drafter(external) == (str(dspark), "")
    # The child swaps the drafter and keeps the target and the label (which picks the prompts).
    weights, _ = resolve_gate_weights()
    assert weights.drafter == str(dspark) and weights.label == "fixture:tiny"
    clean_weights_env.setenv(HEDGE_DRAFTER_ENV, str(tmp_path / "missing"))
    assert resolve_gate_weights()[0] is None


def test_fixture_default_is_the_shipped_dspark_drafter(clean_weights_env):
    from engine.shipped import shipped_dspark

    chosen, reason = hedge_drafter(GateWeights("t", "d", "fixture:tiny"))
    if (shipped_dspark("tiny") / "config.json").is_file():
        assert chosen == str(shipped_dspark("tiny"))
        cfg = json.loads((shipped_dspark("tiny") / "config.json").read_text())
        assert cfg["dflash_config"]["markov_rank"] > 0
    else:
        assert chosen is None and "python -m engine.fixture markov" in reason
