"""The run record (render, paste, refusing partial runs) and the `python -m trace_tools` CLI."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trace_tools import (
    BEGIN,
    END,
    CanaryRow,
    ExcuseRow,
    RecordError,
    RecordHeader,
    RecordRow,
    levers_trace_rows,
    paste,
    render_record,
    summarize,
)
from trace_tools.results import ExcusedLine

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data" / "trace"
ENGINE_LINE = "[DEBUG] DFlash round request=req-3 gated=0 verified_draft=4 accepted_draft=2 committed_tokens=3"
WHOLE = "- cases: 9 of 9\n| t |\n"  # a record of a run that ran every case


# ---- run record ----

HEADER = RecordHeader(
    "abc1234-dirty", "NVIDIA H200", "fixture:tiny", "2026-11-29T08:16:27Z", "pytest gates/ -n 6", 2, 2
)
ROWS = [
    RecordRow("test_greedy_matches_plain_greedy", "MAX_BATCH=1", 315, 0, None, 320, 0, True),
    RecordRow("test_concurrent_heterogeneous_is_lossless", "MAX_DRAFTS=4", 0, 64, 4, None, None, False),
]


def test_render_record_has_header_and_one_row_per_case():
    text = render_record(HEADER, ROWS)
    assert "- head: `abc1234-dirty`" in text and "- device: NVIDIA H200" in text
    assert "- weights: fixture:tiny" in text and "- command: `pytest gates/ -n 6`" in text
    assert "- cases: 2 of 2" in text
    columns = "| child | env | gated rows | speculating rows | max drafts | compared tokens | excused | verdict |"
    assert columns in text
    assert "| test_greedy_matches_plain_greedy | MAX_BATCH=1 | 315 | 0 | - | 320 | 0 | pass |" in text
    assert "| test_concurrent_heterogeneous_is_lossless | MAX_DRAFTS=4 | 0 | 64 | 4 | - | - | FAIL |" in text


def test_render_record_lists_excused_near_ties_and_canaries():
    excuse = ExcuseRow("greedy-MAX_DRAFTS=4", ExcusedLine("greedy", "req-1", 40, 7, 9, 0.012, 0.05))
    canary = CanaryRow("trim-leak", "the trim leaking one draft", "known-MAX_DRAFTS=4", True, "the trim leaks")
    blind = CanaryRow("trace-silent", "no round lines", "known-default-levers", False, "pass")
    text = render_record(dataclasses.replace(HEADER, canaries_total=2), ROWS, [excuse], [canary, blind])
    assert "- cases: 2 of 2\n- canaries: 1 of 2 caught\n" in text
    assert "| greedy-MAX_DRAFTS=4 | req-1 | 40 | 7 | 9 | 0.012 | 0.05 | 0.24 |" in text
    assert "| trim-leak | the trim leaking one draft | known-MAX_DRAFTS=4 | caught | the trim leaks |" in text
    assert "| trace-silent | no round lines | known-default-levers | NOT CAUGHT | pass |" in text
    assert "Excused near-ties: none." in render_record(HEADER, ROWS)
    assert "canaries" not in render_record(HEADER, ROWS)  # a record of a gate without canaries


def test_paste_refuses_a_record_whose_gate_missed_a_canary():
    canary = CanaryRow("trim-leak", "the trim leaking one draft", "known-MAX_DRAFTS=4", True, "the trim leaks")
    missed = render_record(dataclasses.replace(HEADER, canaries_total=2), ROWS, (), [canary])
    with pytest.raises(RecordError, match="caught 1 of 2 canaries"):
        paste(DOC, missed)
    assert "- canaries: 1 of 1 caught" in paste(
        DOC, render_record(dataclasses.replace(HEADER, canaries_total=1), ROWS, (), [canary])
    )


def test_render_record_escapes_pipes_in_cells():
    row = RecordRow("a|b", "MAX_BATCH=1", 1, 0, None, 64, 0, True)
    assert "| a\\|b |" in render_record(HEADER, [row])


DOC = f"# Bench\n\nintro\n\n{BEGIN}\nold table\n{END}\n\ntrailer ` <!-- -->\n"


def test_paste_replaces_only_between_markers():
    out = paste(DOC, WHOLE)
    head, tail = DOC.split(BEGIN)[0], DOC.split(END)[1]
    assert out == f"{head}{BEGIN}\n{WHOLE}{END}{tail}"
    assert out.startswith(head + BEGIN) and out.endswith(END + tail)


def test_paste_is_idempotent():
    record = render_record(HEADER, ROWS)
    once = paste(DOC, record)
    assert paste(once, record) == once
    assert paste(paste(once, WHOLE), record) == once


def test_paste_keeps_crlf_docs_crlf():
    doc = DOC.replace("\n", "\r\n")
    out = paste(doc, WHOLE)
    assert out == doc.replace("old table", WHOLE.rstrip("\n").replace("\n", "\r\n"))
    assert paste(out, WHOLE.replace("\n", "\r\n")) == out


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
        paste(doc, WHOLE)


@pytest.mark.parametrize(
    "record, why", [(f"- cases: 1 of 1\n{BEGIN}\nx\n{END}\n", "refusing to nest"), ("\n\n", "empty")]
)
def test_paste_refuses_records_it_cannot_nest(record, why):
    with pytest.raises(RecordError, match=why):
        paste(DOC, record)


@pytest.mark.parametrize(
    "record, why",
    [
        ("| t |\n", "no `- cases: N of M` line"),
        ("- cases: 8 of 9\n| t |\n", "ran 8 of 9 cases; refusing to paste a partial run"),
        (render_record(dataclasses.replace(HEADER, cases_run=1), ROWS[:1]), "ran 1 of 2 cases"),
    ],
)
def test_paste_refuses_a_partial_record(record, why):
    with pytest.raises(RecordError, match=why):
        paste(DOC, record)
    assert "- cases: 2 of 2" in paste(DOC, render_record(HEADER, ROWS))


def test_cli_paste_refuses_a_partial_record_and_leaves_the_doc(tmp_path):
    doc, record = tmp_path / "bench.md", tmp_path / "record.md"
    doc.write_text(DOC)
    record.write_text(render_record(dataclasses.replace(HEADER, cases_run=1), ROWS[:1]))
    out = cli("paste", "--doc", str(doc), "--record", str(record))
    assert out.returncode == 1 and "partial run" in out.stderr
    assert doc.read_text() == DOC


# ---- CLI ----


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "trace_tools", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
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


def test_cli_paste_takes_the_newest_record_under_gate_records_by_default(tmp_path):
    doc = tmp_path / "bench.md"
    doc.write_text(DOC)
    out = cli("paste", "--doc", str(doc), cwd=tmp_path)
    assert out.returncode == 1 and "no run record under gate-records/" in out.stderr
    records = tmp_path / "gate-records"
    records.mkdir()
    (records / "20261201T061627Z-abc1234.md").write_text(render_record(HEADER, ROWS[:1]))
    (records / "20261201T071627Z-def5678.md").write_text(render_record(HEADER, ROWS))
    out = cli("paste", "--doc", str(doc), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "pasted gate-records/20261201T071627Z-def5678.md" in out.stdout
    assert doc.read_text() == paste(DOC, render_record(HEADER, ROWS))


def test_cli_paste_leaves_a_doc_without_markers_untouched(tmp_path):
    doc, record = tmp_path / "bench.md", tmp_path / "record.md"
    doc.write_text("# Bench\n")
    record.write_text(WHOLE)
    out = cli("paste", "--doc", str(doc), "--record", str(record))
    assert out.returncode == 1 and "exactly one" in out.stderr
    assert doc.read_text() == "# Bench\n"


def test_cli_usage_errors_exit_nonzero():
    assert cli("--help").returncode == 0
    assert cli("paste", "--record", "x.md").returncode == 2
    assert "summarize" in cli().stderr


def test_trace_tools_imports_neither_torch_nor_engine():
    code = (
        "import sys, trace_tools, trace_tools.cli; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'engine')); "
        "assert not bad, bad"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
