"""trace_tools on real-format lines: no weights, no torch."""

from __future__ import annotations

from pathlib import Path

import pytest

from trace_tools import (
    LosslessLine,
    RequestLine,
    RoundRow,
    TraceError,
    levers_trace_rows,
    lossless_lines,
    request_lines,
    summarize,
    unresumed_requests,
)

DATA = Path(__file__).resolve().parent / "data" / "trace"
ENGINE_LINE = "[DEBUG] DFlash round request=req-3 gated=0 verified_draft=4 accepted_draft=2 committed_tokens=3"


def line(req: int, gated: int, verified: int, accepted: int, committed: int | None = None) -> str:
    committed = accepted + 1 if committed is None else committed
    return (
        f"[DEBUG] DFlash round request=req-{req} gated={gated} verified_draft={verified} "
        f"accepted_draft={accepted} committed_tokens={committed}"
    )


# ---- round lines ----


def test_reads_the_engine_line_as_printed():
    assert levers_trace_rows([ENGINE_LINE]) == [RoundRow(3, False, 4, 2, 3)]


SPEC9_LINE = (
    "[DEBUG] DFlash round request=req-3 gated=0 verified_draft=4 accepted_draft=2 committed_tokens=3 "
    "draft_ctx=45 span_limit=4"
)


def test_reads_draft_ctx_and_span_limit_and_lines_without_them():
    assert levers_trace_rows([SPEC9_LINE, ENGINE_LINE]) == [
        RoundRow(3, False, 4, 2, 3, draft_ctx=45, span_limit=4),
        RoundRow(3, False, 4, 2, 3),
    ]


@pytest.mark.parametrize("field", ["draft_ctx", "span_limit"])
def test_a_draft_ctx_or_span_limit_without_digits_is_an_error(field):
    with pytest.raises(TraceError, match=f"{field}="):
        levers_trace_rows([ENGINE_LINE + f" {field}=x"])


def test_reads_the_childs_request_lines():
    lines = [
        "[DEBUG] DFlash request request=req-3 prompt_tokens=12 output_tokens=64 max_tokens=64",
        ENGINE_LINE,
        "noise max_tokens=3 DFlash requests=2",
        "[DEBUG] DFlash request max_tokens=40 output_tokens=7 request=req-11 prompt_tokens=93",
    ]
    assert request_lines(lines) == [RequestLine(3, 12, 64, 64), RequestLine(11, 93, 7, 40)]
    assert levers_trace_rows(lines) == [RoundRow(3, False, 4, 2, 3)]


@pytest.mark.parametrize(
    "bad, missing",
    [
        ("[DEBUG] DFlash request request=req-3 prompt_tokens=12 output_tokens=64", "max_tokens="),
        ("[DEBUG] DFlash request request=req- prompt_tokens=12 output_tokens=64 max_tokens=64", "request="),
    ],
)
def test_a_request_line_missing_a_field_is_an_error(bad, missing):
    with pytest.raises(TraceError, match=missing):
        request_lines([bad])


def test_reads_round_lines_inside_log_and_pytest_noise():
    log = f"""\
2026-11-29 08:16:27,114 engine.scheduler [INFO] admitted req-0 req-1
2026-11-29 08:16:27,120 engine.trace {ENGINE_LINE.replace("req-3", "req-0")}
_____________________ test_concurrent_heterogeneous_is_lossless _____________________
----------------------------- Captured stderr call -----------------------------
[DEBUG] DFlash round request=req-1 gated=1 verified_draft=0 accepted_draft=0 committed_tokens=1
E       AssertionError: tokens differ at position 17 (request req-1)
{ENGINE_LINE}\r
"""
    assert levers_trace_rows(log.splitlines()) == [
        RoundRow(0, False, 4, 2, 3),
        RoundRow(1, True, 0, 0, 1),
        RoundRow(3, False, 4, 2, 3),
    ]


def test_field_order_and_extra_fields_are_free():
    reordered = (
        "[DEBUG] DFlash round committed_tokens=5 span=5 accepted_draft=4 hedge_chains=0 "
        "verified_draft=4 gated=0 request=req-12 step_ms=3.25"
    )
    assert levers_trace_rows([reordered]) == [RoundRow(12, False, 4, 4, 5)]


def test_field_names_match_at_a_word_boundary():
    tricky = (
        "[DEBUG] DFlash round prev_request=req-9 xaccepted_draft=7 request=req-2 gated=0 "
        "verified_draft=3 accepted_draft=1 committed_tokens=2 max_verified_draft=9"
    )
    assert levers_trace_rows([tricky]) == [RoundRow(2, False, 3, 1, 2)]


def test_fields_before_the_marker_are_not_read():
    # A log prefix that happens to carry `request=` must not stand in for the round's own field.
    prefix = "ctx request=req-8 | [DEBUG] DFlash round gated=1 verified_draft=0 accepted_draft=0 committed_tokens=1"
    with pytest.raises(TraceError, match="request="):
        levers_trace_rows([prefix])


def test_other_lines_are_ignored():
    noise = [
        "[INFO] DFlash rounds per second: 12.5 request=req-1",
        "[DEBUG] plan=SpeculativeDecode batch=4 request=req-0",
        "[lossless] test=test_x requests=1 compared_tokens=64 excused=0",
        "",
    ]
    assert levers_trace_rows(noise) == []


@pytest.mark.parametrize(
    "bad, missing",
    [
        ("[DEBUG] DFlash round request=req-3 gated=0 verified_draft=4 accepted_draft=2", "committed_tokens="),
        ("[DEBUG] DFlash round gated=0 verified_draft=4 accepted_draft=2 committed_tokens=3", "request="),
        ("[DEBUG] DFlash round request=req-x gated=0 verified_draft=4 accepted_draft=2 committed_tokens=3", "request="),
        # the value ends at whitespace: `gated=` must not borrow the 4 of the next field
        ("[DEBUG] DFlash round request=req-3 gated= verified_draft=4 accepted_draft=2 committed_tokens=3", "gated="),
        # ASCII digits only: an Arabic-Indic three is not a request id
        (
            "[DEBUG] DFlash round request=req-\u0663 gated=0 verified_draft=4 accepted_draft=2 committed_tokens=3",
            "request=",
        ),
    ],
)
def test_a_round_line_missing_a_field_is_an_error_quoting_it(bad, missing):
    with pytest.raises(TraceError, match=missing) as err:
        levers_trace_rows(["[INFO] warmup done", bad])
    assert isinstance(err.value, ValueError)
    assert "line 2" in str(err.value) and repr(bad) in str(err.value)


def test_gated_must_be_a_flag():
    with pytest.raises(TraceError, match="gated=2"):
        levers_trace_rows([ENGINE_LINE.replace("gated=0", "gated=2")])


def test_a_whole_string_is_refused_rather_than_read_as_characters():
    with pytest.raises(TypeError, match="splitlines"):
        levers_trace_rows(ENGINE_LINE)


def test_sample_log_parses_one_row_per_round_line():
    text = (DATA / "concurrent-max-batch-3.log").read_text()
    rows = levers_trace_rows(text.splitlines())
    round_lines = [ln for ln in text.splitlines() if "DFlash round" in ln]
    assert len(rows) == len(round_lines) > 0
    assert sum(r.gated for r in rows) == sum(" gated=1" in ln for ln in round_lines)
    assert [f"req-{r.request}" for r in rows] == [ln.split("request=")[1].split()[0] for ln in round_lines]


# ---- lossless lines ----


def test_reads_lossless_lines():
    lines = [
        "gates/test_lossless.py::test_greedy_matches_plain_greedy [INFO] engine: loaded",
        "[lossless] test=test_greedy_matches_plain_greedy requests=5 compared_tokens=320 excused=1",
        "[lossless] excused=0 compared_tokens=64 test=test_short requests=2 note=x",
        ".",
    ]
    assert lossless_lines(lines) == [
        LosslessLine("test_greedy_matches_plain_greedy", 5, 320, 1),
        LosslessLine("test_short", 2, 64, 0),
    ]


@pytest.mark.parametrize(
    "bad, missing",
    [
        ("[lossless] requests=5 compared_tokens=320 excused=1", "test="),
        ("[lossless] test=t requests=5 compared_tokens=320 excused_divergences=0", "excused="),
        ("[lossless] test=t requests=five compared_tokens=320 excused=0", "requests="),
    ],
)
def test_a_lossless_line_missing_a_field_is_an_error(bad, missing):
    with pytest.raises(TraceError, match=missing):
        lossless_lines([bad])


# ---- summaries ----


def test_summary_counts_rows_and_the_widest_verify():
    rows = levers_trace_rows([line(0, 1, 0, 0), line(1, 1, 0, 0), line(0, 0, 4, 2), line(0, 0, 2, 2)])
    s = summarize(rows)
    assert (s.rounds, s.gated_rounds, s.speculating_rounds, s.max_drafts) == (4, 2, 2, 4)
    assert s.requests == (0, 1) and s.gated_requests == (0, 1) and s.unresumed_requests == (1,)


def test_max_drafts_is_none_without_a_speculating_row():
    assert summarize(levers_trace_rows([line(0, 1, 0, 0)])).max_drafts is None


@pytest.mark.parametrize(
    "trace, unresumed",
    [
        ([line(0, 1, 0, 0), line(0, 0, 4, 1)], []),
        # an acceptance before the first gated round is not a resume
        ([line(0, 0, 4, 3), line(0, 1, 0, 0), line(0, 0, 4, 0)], [0]),
        # another request's acceptance does not count for this one
        ([line(0, 1, 0, 0), line(1, 1, 0, 0), line(1, 0, 4, 2)], [0]),
        # speculating again but never accepting, or only budget-truncated spans: not a resume
        ([line(0, 1, 0, 0), line(0, 0, 4, 0), line(0, 0, 0, 0)], [0]),
        # gated twice, resumed after the second gate: the first gated round opens the window
        ([line(2, 1, 0, 0), line(2, 0, 4, 1), line(2, 1, 0, 0)], []),
    ],
)
def test_unresumed_requests_is_checked_per_request_and_in_order(trace, unresumed):
    assert unresumed_requests(levers_trace_rows(trace)) == unresumed
