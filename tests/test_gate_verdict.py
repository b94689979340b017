"""The verdict on a whole child output: exit code, trace vs case, trace vs the child's own requests,
the [lossless] lines (every requested token compared, excused near-ties listed under their bounds),
a failed lossless check named, the gate line."""

from __future__ import annotations

from pathlib import Path

import pytest

from gates.cases import ALL_CASES, CASES
from gates.verdict import check_child, gate_line
from tests.gate_traces import complete, request_line
from trace_tools import RecordRow, levers_trace_rows

DATA = Path(__file__).resolve().parent / "data" / "trace"
CASE = {c.id: c for c in ALL_CASES}


def rnd(req: int, gated: int, verified: int, accepted: int) -> str:
    return (
        f"[DEBUG] DFlash round request=req-{req} gated={gated} verified_draft={verified} "
        f"accepted_draft={accepted} committed_tokens={accepted + 1}"
    )


RESUME = [rnd(r, 1, 0, 0) for _ in range(3) for r in range(4)] + [rnd(r, 0, 7, 2) for r in range(3)]


def recorded(name: str) -> str:
    return (DATA / name).read_text()


# ---- recorded real child outputs pass ----


@pytest.mark.parametrize(
    "case_id, log",
    [
        ("concurrent-MAX_BATCH=3", "concurrent-max-batch-3.log"),
        ("greedy-MAX_DRAFTS=4", "greedy-max-drafts-4.log"),
        ("stop-default-levers", "stop.log"),
        ("concurrent-HEDGE=8-HEDGE_POSITIONS=0,1,2-MAX_BATCH=3", "concurrent-hedge-max-batch-3.log"),
    ],
)
def test_a_recorded_child_output_passes(case_id, log):
    result = check_child(CASE[case_id], 0, recorded(log))
    assert result.problems == ()
    assert result.compared_tokens > 0 and result.excused == 0


def _lose_gated_captures(text: str) -> list[str]:
    """The planted fault on a real trace: gated rounds stop storing their row, so each request's
    context falls one more row behind with every gated round."""
    out, behind = [], {}
    for line in text.splitlines():
        rows = levers_trace_rows([line])
        if rows and rows[0].draft_ctx:
            r = rows[0]
            behind[r.request] = behind.get(r.request, 0) + r.gated
            line = line.replace(f"draft_ctx={r.draft_ctx}", f"draft_ctx={r.draft_ctx - behind[r.request]}")
        out.append(line)
    return out


def test_a_recorded_trace_with_lost_captures_fails_by_name():
    found = check_child(
        CASE["concurrent-MAX_BATCH=3"], 0, "\n".join(_lose_gated_captures(recorded("concurrent-max-batch-3.log")))
    )
    assert any(
        p.startswith("req-0: gated round left the drafter context at 80 after 81 committed tokens")
        for p in found.problems
    )
    assert not found.row.passed


def test_a_recorded_trace_with_shifted_ids_fails():
    shifted = recorded("greedy-max-drafts-4.log")
    for i in range(4, -1, -1):  # highest first: no line shifts twice
        shifted = shifted.replace(f"round request=req-{i} ", f"round request=req-{i + 1} ")
    found = check_child(CASE["greedy-MAX_DRAFTS=4"], 0, shifted).problems
    assert (
        "the trace names req-5, which the child never ran (it ran req-0, req-1, req-2, req-3, req-4): the ids are wrong"
        in found
    )


# ---- exit code, missing or partial lines ----


def test_child_that_printed_no_round_lines_fails():
    for case in CASES:
        result = check_child(case, 0, "\n".join(["[INFO] engine: loaded", *complete([])[-1:], "."]))
        assert any("no DFlash round lines" in p for p in result.problems)
        assert not result.row.passed


def test_child_exit_code_fails_even_with_a_good_trace():
    case, output = CASE["concurrent-MAX_BATCH=3"], "\n".join(complete(RESUME))
    assert check_child(case, 0, output).problems == ()
    assert check_child(case, 1, output).problems == ("the child exited 1: its lossless assertions or its setup failed",)
    assert check_child(case, None, output, timeout_s=1800).problems == ("the child was killed after 1800 s",)


def test_child_without_a_lossless_line_fails():
    output = "\n".join(complete(RESUME)[:-1])
    result = check_child(CASE["concurrent-MAX_BATCH=3"], 0, output)
    assert result.problems == ("no [lossless] line: the child compared nothing (skipped, or failed first)",)
    assert result.row.compared_tokens is None and result.row.excused is None


def test_child_that_compared_no_tokens_fails():
    lines = complete(RESUME)[:-1] + ["[lossless] test=t requests=4 compared_tokens=0 excused=0"]
    assert (
        "the child's [lossless] lines compared 0 tokens"
        in check_child(CASE["concurrent-MAX_BATCH=3"], 0, "\n".join(lines)).problems
    )


def test_a_child_that_compares_only_a_prefix_of_each_output_fails():
    # The planted fault: the lossless check stops after 8 tokens of each 64-token output.
    good = complete([rnd(0, 0, 4, 4)] * 12 + [rnd(0, 0, 2, 2)])
    assert check_child(CASE["greedy-MAX_DRAFTS=4"], 0, "\n".join(good)).problems == ()
    short = good[:-1] + ["[lossless] test=t requests=1 compared_tokens=8 excused=0"]
    found = check_child(CASE["greedy-MAX_DRAFTS=4"], 0, "\n".join(short)).problems
    assert "the child compared 8 tokens but its requests produced 64: part of the output went unchecked" in found


def test_the_lossless_lines_must_count_the_childs_requests():
    lines = complete(RESUME)
    lines[-1] = lines[-1].replace("requests=4", "requests=3")
    found = check_child(CASE["concurrent-MAX_BATCH=3"], 0, "\n".join(lines)).problems
    assert found == ("the [lossless] lines count 3 requests, the child ran 4",)


def test_excused_near_ties_are_listed_under_their_bound_and_none_under_batch_invariance():
    case = CASE["concurrent-MAX_BATCH=3"]
    near = [(0.01, 0.05), (0.02, 0.03)]
    result = check_child(case, 0, "\n".join(complete(RESUME, excuses=near)))
    assert result.problems == () and [(e.gap, e.bound) for e in result.excuses] == near
    over = check_child(case, 0, "\n".join(complete(RESUME, excuses=[(0.01, 0.05), (0.3, 0.05)]))).problems
    assert over == ("req-0 output token 2 was excused 0.3 logits behind the fp32 top token, over its bound 0.05",)
    unlisted = [ln for ln in complete(RESUME, excuses=near) if not ln.startswith("[excused]")]
    found = check_child(case, 0, "\n".join(unlisted)).problems
    assert found == ("the [lossless] lines excused 2 near-ties but 0 are listed",)
    exact = check_child(case, 0, "\n".join(complete(RESUME, excuses=near[:1])), exact=True).problems
    assert exact == ("1 near-ties excused: batch-invariant numerics excuse none",)


def test_a_failed_lossless_check_is_named_in_the_verdict():
    lines = complete(RESUME) + ["[lossless-failed] req-2 output token 70: the target picks 5, speculative 6"]
    found = check_child(CASE["concurrent-MAX_BATCH=3"], 1, "\n".join(lines)).problems
    assert "the lossless check failed: req-2 output token 70: the target picks 5, speculative 6" in found


def test_trace_faults_that_need_the_childs_requests_fail_the_case():
    good = complete(RESUME)
    shifted = [ln.replace("round request=req-", "round request=req-1") for ln in good]  # req-0 -> req-10 ...
    found = check_child(CASE["concurrent-MAX_BATCH=3"], 0, "\n".join(shifted)).problems
    assert any("which the child never ran" in p for p in found)
    lost = [ln.replace("draft_ctx=11 ", "draft_ctx=10 ") for ln in good]  # the first gated round's capture
    found = check_child(CASE["concurrent-MAX_BATCH=3"], 0, "\n".join(lost)).problems
    assert any(
        p.startswith("req-0: gated round left the drafter context at 10 after 11 committed tokens") for p in found
    )
    assert request_line(3, 10, 4, 4) in good  # req-3: prefill + 3 gated rounds


def test_unreadable_trace_is_a_problem_not_a_crash():
    lines = complete(RESUME)
    lines.insert(3, "[DEBUG] DFlash round request=req-0 gated=1")
    found = check_child(CASE["concurrent-MAX_BATCH=3"], 0, "\n".join(lines)).problems
    assert len(found) == 1 and found[0].startswith("unreadable trace: line 4")


# ---- the row and the gate line ----


def test_row_carries_compared_tokens_excused_and_the_verdict():
    case = CASE["concurrent-MAX_BATCH=3"]
    row = check_child(case, 0, "\n".join(complete(RESUME, excuses=[(0.01, 0.05)]))).row
    assert row == RecordRow(case.child, "MAX_BATCH=3", 12, 3, 7, 3 * 7 + 4, 1, True)


def test_gate_line_format():
    row = RecordRow("test_greedy_matches_plain_greedy", "MAX_BATCH=1", 315, 0, None, 320, 0, True)
    assert gate_line(row) == (
        "spec lever gate: child=test_greedy_matches_plain_greedy env=MAX_BATCH=1 "
        "gated_rounds=315 speculating_rounds=0 max_drafts=- compared_tokens=320 excused=0"
    )
    assert gate_line(RecordRow("c", "MAX_DRAFTS=4", 0, 64, 4, None, None, False)).endswith(
        "max_drafts=4 compared_tokens=- excused=-"
    )
