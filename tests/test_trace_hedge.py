"""trace_tools on real-format `DFlash hedge` lines: no weights, no torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trace_tools import HedgeRow, HedgeSummary, TraceError, hedge_trace_rows, levers_trace_rows, summarize_hedge

ROOT = Path(__file__).resolve().parents[1]
HEDGE = "[DEBUG] DFlash hedge request=req-3 chains=3 winner=2 main_accepted=1 best_accepted=4"
ROUND = "[DEBUG] DFlash round request=req-3 gated=0 verified_draft=5 accepted_draft=4 committed_tokens=5"


def hedge(req: int, chains: int, winner: int, main: int, best: int | None = None) -> str:
    best = main if best is None else best
    return (
        f"[DEBUG] DFlash hedge request=req-{req} chains={chains} winner={winner} "
        f"main_accepted={main} best_accepted={best}"
    )


def test_reads_the_engine_line_as_printed():
    assert hedge_trace_rows([HEDGE]) == [HedgeRow(3, 3, 2, 1, 4)]


def test_round_and_hedge_lines_do_not_mix():
    lines = ["2026-12-01 engine.trace " + ROUND, HEDGE, "noise request=req-9 chains=1"]
    assert hedge_trace_rows(lines) == [HedgeRow(3, 3, 2, 1, 4)]
    assert [r.request for r in levers_trace_rows(lines)] == [3]


def test_field_order_and_extra_fields_are_free():
    line = "[DEBUG] DFlash hedge best_accepted=2 branch=1 winner=0 main_accepted=2 request=req-12 chains=1"
    assert hedge_trace_rows([line]) == [HedgeRow(12, 1, 0, 2, 2)]


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ("[DEBUG] DFlash hedge request=req-0 chains=3 winner=0 main_accepted=1", "best_accepted="),
        (hedge(0, 2, 3, 0, 1), "only 2 chains"),
        (hedge(0, 3, 1, 2, 2), "disagrees"),  # a chain won but accepted no more than the main one
        (hedge(0, 3, 0, 1, 3), "disagrees"),  # the main chain won with fewer than the best
        (hedge(0, 3, 1, 3, 1), "disagrees"),
    ],
)
def test_malformed_or_impossible_lines_are_errors(line, match):
    with pytest.raises(TraceError, match=match):
        hedge_trace_rows([line])


def test_a_string_is_not_a_list_of_lines():
    with pytest.raises(TypeError):
        hedge_trace_rows(HEDGE)


def test_summary_counts_chains_wins_and_discards():
    rows = hedge_trace_rows([hedge(0, 3, 0, 2), hedge(1, 3, 2, 0, 3), hedge(0, 1, 1, 0, 1)])
    s = summarize_hedge(rows)
    assert s == HedgeSummary(hedged_rounds=3, chains=7, wins=2, discards=5)
    assert s.line == "hedged_rounds=3 chains=7 wins=2 discards=5"
    assert summarize_hedge([]) == HedgeSummary(0, 0, 0, 0)


def test_cli_summarize_prints_the_hedge_line(tmp_path):
    log = tmp_path / "child.log"
    log.write_text("\n".join([ROUND, HEDGE, hedge(3, 3, 0, 1)]) + "\n")
    out = subprocess.run(
        [sys.executable, "-m", "trace_tools", "summarize", str(log)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "hedge: hedged_rounds=2 chains=6 wins=1 discards=5" in out


def test_trace_tools_does_not_import_torch():
    code = "import sys, trace_tools; trace_tools.hedge_trace_rows([]); assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
