"""The trace cross-checked against the child's requests (SPEC 9): committed tokens add up, rounds stay
within their limits, the drafter context holds every committed token but the newest. Each planted
fault of issue 15 that shows in the trace fails here by name."""

from __future__ import annotations

import pytest

from trace_tools import RequestLine, gated_hedges, levers_trace_rows, request_lines, request_problems


def rnd(req: int, gated: int, verified: int, accepted: int, committed: int, ctx: int, limit: int) -> str:
    return (
        f"[DEBUG] DFlash round request=req-{req} gated={gated} verified_draft={verified} "
        f"accepted_draft={accepted} committed_tokens={committed} draft_ctx={ctx} span_limit={limit}"
    )


def req_line(req: int, prompt: int, output: int, budget: int) -> str:
    return f"[DEBUG] DFlash request request=req-{req} prompt_tokens={prompt} output_tokens={output} max_tokens={budget}"


# req-0: 12 prompt tokens, budget 10. Prefill: 1 token (context 12 = the prompt).
# A speculating round (+3: context 15), a gated round (+1: 16), a speculating round (+4: 20), then a
# last round with 1 token of budget left (limit 0, +1) that finishes the request and frees the context.
GOOD = [
    rnd(0, 0, 4, 2, 3, 15, 4),
    rnd(0, 1, 0, 0, 1, 16, 0),
    rnd(0, 0, 4, 3, 4, 20, 4),
    rnd(0, 0, 0, 0, 1, 0, 4),
    req_line(0, 12, 10, 10),
]


def problems(lines: list[str], stops: bool = False) -> list[str]:
    return request_problems(levers_trace_rows(lines), request_lines(lines), stops)


def test_a_consistent_trace_passes():
    assert problems(GOOD) == []
    assert problems(GOOD, stops=True) == []


def test_a_gated_round_that_loses_its_capture_fails_by_name():
    lines = [*GOOD]
    lines[1] = rnd(0, 1, 0, 0, 1, 15, 0)  # the gated forward's row never joined the context
    lines[2] = rnd(0, 0, 4, 3, 4, 19, 4)  # ... and every later round is one row short
    found = problems(lines)
    assert "req-0: gated round left the drafter context at 15 after 16 committed tokens: the capture is lost" in found
    assert "req-0: speculating round left the drafter context at 19 after 20 committed tokens: the capture is lost" in (
        found
    )


def test_rejected_rows_in_the_context_fail():
    lines = [rnd(0, 0, 4, 2, 3, 17, 4), *GOOD[1:]]  # the two rejected drafts' rows were kept
    assert any("at 17 after 15 committed tokens: rows that were not committed joined it" in p for p in problems(lines))


def test_trace_ids_shifted_by_one_fail():
    shifted = [line.replace("round request=req-0", "round request=req-1") for line in GOOD]
    found = problems(shifted)
    assert "the trace names req-1, which the child never ran (it ran req-0): the ids are wrong" in found
    assert any(p.startswith("req-0: the prefill's token plus the trace's committed tokens make 1") for p in found)


def test_an_accept_limit_that_ignores_the_remaining_budget_fails():
    # 2 tokens of budget left, yet 3 drafts accepted: the request commits 2 and reports 3.
    lines = [rnd(0, 0, 4, 2, 3, 15, 4), rnd(0, 0, 4, 3, 4, 19, 4), rnd(0, 0, 4, 3, 2, 0, 4), req_line(0, 12, 10, 10)]
    found = problems(lines)
    assert (
        "req-0: speculating round 3 accepted 3 drafts with 2 tokens of budget left (at most 1 plus the bonus): "
        "the accept limit ignores the remaining budget" in found
    )
    assert "req-0: speculating round 3 accepted 3 drafts but committed 2 tokens without stopping on a stop token" in (
        found
    )


def test_committed_tokens_that_do_not_add_up_to_the_output_fail():
    found = problems([*GOOD[:3], req_line(0, 12, 10, 10)])  # the last round line is missing
    assert found == [
        "req-0: the prefill's token plus the trace's committed tokens make 9, but the child got 10 output tokens"
    ]


def test_a_round_after_the_request_finished_fails():
    found = problems([*GOOD[:4], rnd(0, 0, 4, 1, 2, 0, 4), req_line(0, 12, 10, 10)])
    assert any("round 5 ran after the request had all its 10 tokens" in p for p in found)


def test_a_stop_inside_an_accepted_run_is_fine_only_where_stops_are_on():
    # Stop token on the 2nd of 4 accepted drafts: 2 committed, the request ends at 6 of 64.
    lines = [rnd(0, 0, 4, 2, 3, 15, 4), rnd(0, 0, 4, 4, 2, 0, 4), req_line(0, 12, 6, 64)]
    assert problems(lines, stops=True) == []
    found = problems(lines, stops=False)
    assert "req-0: 6 of 64 tokens, but the child ignores EOS: the request ended early" in found
    # A stop that did not end the request is no stop: the committed run was cut short
    cut = [rnd(0, 0, 4, 2, 3, 15, 4), rnd(0, 0, 4, 4, 2, 17, 4), rnd(0, 1, 0, 0, 1, 0, 0), req_line(0, 12, 7, 64)]
    assert any("accepted 4 drafts but committed 2" in p for p in problems(cut, stops=True))


@pytest.mark.parametrize(
    "line, why",
    [
        (rnd(0, 0, 4, 2, 3, 15, 3), "verified 4 drafts over its span_limit 3"),
        (rnd(0, 0, 2, 3, 4, 16, 4), "accepted 3 of 2 verified drafts"),
        (rnd(0, 1, 2, 1, 2, 15, 4), "a gated round verifies none"),
        (rnd(0, 0, 4, 1, 3, 15, 4), "committed 3 tokens after accepting 1 drafts"),
    ],
)
def test_rounds_beyond_their_limits_fail(line, why):
    assert any(why in p for p in problems([line, *GOOD[1:]]))


def test_requests_and_context_must_be_there_to_be_checked():
    assert problems(GOOD[:4]) == ["the child printed no `DFlash request` line: its trace cannot be cross-checked"]
    old = [line.split(" draft_ctx=")[0] for line in GOOD[:4]] + [GOOD[4]]
    assert problems(old) == ["round lines without draft_ctx=: the capture cannot be checked (an engine before SPEC 9?)"]
    twice = [*GOOD, GOOD[4]]
    assert "the child printed two `DFlash request` lines for req-0" in problems(twice)


def test_a_request_without_rounds_is_checked_too():
    assert request_problems([], [RequestLine(4, 10, 1, 1)], stops=False) == []
    assert request_problems([], [RequestLine(4, 10, 3, 3)], stops=False) == [
        "req-4: the prefill's token plus the trace's committed tokens make 1, but the child got 3 output tokens"
    ]


def test_gated_hedges_names_requests_whose_chains_ran_in_a_gated_round():
    hedge = "[DEBUG] DFlash hedge request=req-{} chains=3 winner=0 main_accepted=1 best_accepted=1"
    lines = [rnd(0, 0, 4, 1, 2, 14, 4), hedge.format(0), rnd(1, 1, 0, 0, 1, 20, 0), hedge.format(1)]
    assert gated_hedges(lines) == [1]
    assert gated_hedges(lines[:2]) == []
