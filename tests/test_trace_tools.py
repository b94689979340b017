"""trace_tools on real-format lines: no weights, no torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trace_tools import (
    BEGIN,
    END,
    LosslessLine,
    RecordError,
    RecordHeader,
    RecordRow,
    RoundRow,
    TraceError,
    levers_trace_rows,
    lossless_lines,
    paste,
    render_record,
    summarize,
    unresumed_requests,
)

ROOT = Path(__file__).resolve().parents[1]
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
        "[lossless] test=test_x requests=1 compared_tokens=64 excused_divergences=0",
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
        "[lossless] test=test_greedy_matches_plain_greedy requests=5 compared_tokens=320 excused_divergences=1",
        "[lossless] excused_divergences=0 compared_tokens=64 test=test_short requests=2 note=x",
        ".",
    ]
    assert lossless_lines(lines) == [
        LosslessLine("test_greedy_matches_plain_greedy", 5, 320, 1),
        LosslessLine("test_short", 2, 64, 0),
    ]


@pytest.mark.parametrize(
    "bad, missing",
    [
        ("[lossless] requests=5 compared_tokens=320 excused_divergences=1", "test="),
        ("[lossless] test=t requests=5 compared_tokens=320", "excused_divergences="),
        ("[lossless] test=t requests=five compared_tokens=320 excused_divergences=0", "requests="),
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


# ---- run record ----

HEADER = RecordHeader("abc1234-dirty", "NVIDIA H200", "fixture:tiny", "2026-11-29T08:16:27Z", "pytest gates/ -n 6")
ROWS = [
    RecordRow("test_greedy_matches_plain_greedy", "MAX_BATCH=1", 315, 0, None, 0, True),
    RecordRow("test_concurrent_heterogeneous_is_lossless", "MAX_DRAFTS=4", 0, 64, 4, None, False),
]


def test_render_record_has_header_and_one_row_per_case():
    text = render_record(HEADER, ROWS)
    assert "- head: `abc1234-dirty`" in text and "- device: NVIDIA H200" in text
    assert "- weights: fixture:tiny" in text and "- command: `pytest gates/ -n 6`" in text
    columns = "| child | env | gated rows | speculating rows | max drafts | excused divergences | verdict |"
    assert columns in text
    assert "| test_greedy_matches_plain_greedy | MAX_BATCH=1 | 315 | 0 | - | 0 | pass |" in text
    assert "| test_concurrent_heterogeneous_is_lossless | MAX_DRAFTS=4 | 0 | 64 | 4 | - | FAIL |" in text


def test_render_record_escapes_pipes_in_cells():
    row = RecordRow("a|b", "MAX_BATCH=1", 1, 0, None, 0, True)
    assert "| a\\|b |" in render_record(HEADER, [row])


DOC = f"# Bench\n\nintro\n\n{BEGIN}\nold table\n{END}\n\ntrailer ` <!-- -->\n"


def test_paste_replaces_only_between_markers():
    out = paste(DOC, "| t |\n")
    head, tail = DOC.split(BEGIN)[0], DOC.split(END)[1]
    assert out == f"{head}{BEGIN}\n| t |\n{END}{tail}"
    assert out.startswith(head + BEGIN) and out.endswith(END + tail)


def test_paste_is_idempotent():
    record = render_record(HEADER, ROWS)
    once = paste(DOC, record)
    assert paste(once, record) == once
    assert paste(paste(once, "other\n"), record) == once


def test_paste_keeps_crlf_docs_crlf():
    doc = DOC.replace("\n", "\r\n")
    out = paste(doc, "a\nb\n")
    assert out == doc.replace("old table", "a\r\nb")
    assert paste(out, "a\r\nb\r\n") == out


@pytest.mark.parametrize(
    "doc, why",
    [
        ("# Bench\n\nno markers\n", "exactly one"),
        (f"{BEGIN}\n", "exactly one"),
        (f"{BEGIN}\n{END}\n{BEGIN}\n{END}\n", "exactly one"),
        (f"{END}\n{BEGIN}\n", "before"),
    ],
)
def test_paste_refuses_docs_without_one_balanced_pair(doc, why):
    with pytest.raises(RecordError, match=why):
        paste(doc, "| t |\n")


@pytest.mark.parametrize("record, why", [(f"{BEGIN}\nx\n{END}\n", "refusing"), ("\n\n", "empty")])
def test_paste_refuses_records_it_cannot_nest(record, why):
    with pytest.raises(RecordError, match=why):
        paste(DOC, record)


# ---- CLI ----


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trace_tools", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def test_cli_summarize_prints_the_child_summary():
    out = cli("summarize", str(DATA / "concurrent-max-batch-3.log"), "--child", "concurrent")
    assert out.returncode == 0, out.stderr
    rows = levers_trace_rows((DATA / "concurrent-max-batch-3.log").read_text().splitlines())
    s = summarize(rows)
    assert (
        f"child=concurrent rounds={s.rounds} gated_rounds={s.gated_rounds} "
        f"speculating_rounds={s.speculating_rounds} max_drafts={s.max_drafts}"
    ) in out.stdout
    assert "lossless: test=concurrent_heterogeneous_is_lossless" in out.stdout


def test_cli_summarize_fails_on_a_broken_round_line(tmp_path):
    log = tmp_path / "child.log"
    log.write_text(ENGINE_LINE + "\n[DEBUG] DFlash round request=req-1 gated=1\n")
    out = cli("summarize", str(log))
    assert out.returncode == 1
    assert "error: line 2" in out.stderr and "request=req-1 gated=1" in out.stderr


def test_cli_paste_rewrites_the_doc_in_place(tmp_path):
    doc, record = tmp_path / "bench.md", tmp_path / "record.md"
    doc.write_bytes(DOC.encode())
    record.write_text(render_record(HEADER, ROWS))
    first = cli("paste", "--doc", str(doc), "--record", str(record))
    assert first.returncode == 0, first.stderr
    assert doc.read_text() == paste(DOC, record.read_text())
    again = cli("paste", "--doc", str(doc), "--record", str(record))
    assert again.returncode == 0 and "already up to date" in again.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.md", "record.md"]  # no temp file left


def test_cli_paste_leaves_a_doc_without_markers_untouched(tmp_path):
    doc, record = tmp_path / "bench.md", tmp_path / "record.md"
    doc.write_text("# Bench\n")
    record.write_text("| t |\n")
    out = cli("paste", "--doc", str(doc), "--record", str(record))
    assert out.returncode == 1 and "exactly one" in out.stderr
    assert doc.read_text() == "# Bench\n"


def test_cli_usage_errors_exit_nonzero():
    assert cli("--help").returncode == 0
    assert cli("paste", "--doc", "x.md").returncode == 2
    assert "summarize" in cli().stderr


def test_trace_tools_imports_neither_torch_nor_engine():
    code = (
        "import sys, trace_tools, trace_tools.cli; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'engine')); "
        "assert not bad, bad"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
