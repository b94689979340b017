"""The gate's run record (rows, file, commit, recorder) and the conftest hooks in real pytest sessions."""

from __future__ import annotations

import json
import os
import re
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest

from gates.canaries import CANARIES
from gates.cases import ALL_CASES, CASES
from gates.run_record import (
    CANARY_PROPERTY,
    RECORD_ENV,
    RunRecorder,
    canary_line,
    canary_property,
    default_record,
    guarded_path,
    head_commit,
    read_row_property,
    record_path,
    row_property,
    write_run_record,
)
from gates.verdict import gate_line
from trace_tools import CanaryRow, ExcuseRow, RecordHeader, RecordRow, render_record
from trace_tools.results import ExcusedLine

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]

# ---- run record ----

HEADER = RecordHeader("abc1234", "cpu (x86_64)", "fixture:tiny", "2026-11-29T08:16:27Z", "pytest gates/", 2, 9, 11)
ROWS = [
    RecordRow("test_greedy_matches_plain_greedy", "MAX_BATCH=1", 315, 0, None, 320, 0, True),
    RecordRow("test_concurrent_heterogeneous_is_lossless", "MAX_BATCH=3", 140, 8, 7, 176, 1, False),
]


EXCUSE = ExcuseRow("concurrent-MAX_BATCH=3", ExcusedLine("concurrent", "req-2", 17, 5, 6, 0.0123, 0.0456))
CANARY = CanaryRow("trim-leak", "the trim leaking", "concurrent-MAX_DRAFTS=2", True, "62 rounds ...: the trim leaks")


def test_row_and_canary_properties_round_trip_through_json():
    name, value = row_property("concurrent-MAX_BATCH=3", ROWS[1], "fixture:tiny", [EXCUSE])
    assert json.loads(value)["case"] == "concurrent-MAX_BATCH=3"
    assert read_row_property(value) == ("concurrent-MAX_BATCH=3", "fixture:tiny", ROWS[1], [EXCUSE])
    assert read_row_property(row_property("c", ROWS[0], "w")[1])[3] == []
    name, value = canary_property(CANARY)
    assert name == CANARY_PROPERTY and CanaryRow(**json.loads(value)) == CANARY


def test_write_run_record_replaces_the_file(tmp_path):
    path = tmp_path / "records" / "levers-gate-cpu.md"
    write_run_record(path, HEADER, ROWS[:1])
    write_run_record(path, HEADER, ROWS)
    assert path.read_text() == render_record(HEADER, ROWS)
    assert sorted(p.name for p in path.parent.iterdir()) == ["levers-gate-cpu.md"]


def test_the_default_record_is_named_by_utc_time_and_commit(tmp_path):
    stamp = datetime(2026, 12, 1, 8, 16, 27, tzinfo=timezone(timedelta(hours=2)))
    path = default_record(tmp_path, stamp, "abc1234-dirty")
    assert path == tmp_path / "gate-records" / "20261201T061627Z-abc1234-dirty.md"
    assert default_record(tmp_path, stamp, "unknown (no git)").name == "20261201T061627Z-unknown-no-git.md"
    later = default_record(tmp_path, stamp + timedelta(seconds=1), "0000000")
    assert sorted([later.name, path.name])[-1] == later.name  # the newest sorts last: what paste takes


def test_record_path_precedence(tmp_path, monkeypatch):
    monkeypatch.delenv(RECORD_ENV, raising=False)
    default = tmp_path / "gate-records" / "x.md"
    assert record_path(None, default) == default
    monkeypatch.setenv(RECORD_ENV, str(tmp_path / "env.md"))
    assert record_path(None, default) == tmp_path / "env.md"
    assert record_path(str(tmp_path / "opt.md"), default) == tmp_path / "opt.md"


def test_a_partial_run_never_writes_under_docs(tmp_path):
    repo, default = tmp_path / "repo", tmp_path / "gate-records" / "x.md"
    doc = repo / "docs" / "benchmarks" / "records" / "levers-gate-cpu.md"
    assert guarded_path(doc, whole=True, default=default, repo=repo) == doc
    assert guarded_path(doc, whole=False, default=default, repo=repo) == default
    elsewhere = tmp_path / "mine.md"
    assert guarded_path(elsewhere, whole=False, default=default, repo=repo) == elsewhere


def test_head_commit_marks_a_dirty_tree_and_tolerates_no_git(tmp_path):
    assert head_commit(tmp_path, environ={}) == "unknown (no git)"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "f").write_text("a")
    subprocess.run([*git, "-C", str(tmp_path), "add", "f"], check=True)
    subprocess.run([*git, "-C", str(tmp_path), "commit", "-qm", "c"], check=True)
    clean = head_commit(tmp_path, environ={})
    assert len(clean) >= 7 and not clean.endswith("-dirty")
    (tmp_path / "untracked").write_text("u")
    assert head_commit(tmp_path, environ={}) == clean
    (tmp_path / "f").write_text("b")
    assert head_commit(tmp_path, environ={}) == f"{clean}-dirty"


def test_head_commit_prefers_the_commit_named_for_a_device_copy(tmp_path, monkeypatch):
    """A device copy may carry a stale .git: PEGASPEC_COMMIT (what the caller shipped) wins."""
    assert head_commit(tmp_path, environ={"PEGASPEC_COMMIT": "abc1234"}) == "abc1234"
    monkeypatch.setenv("PEGASPEC_COMMIT", "def5678")
    assert head_commit(tmp_path) == "def5678"
    assert head_commit() == "def5678"


class _Terminal:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def section(self, title: str) -> None:
        self.lines.append(f"== {title}")

    def write_line(self, line: str) -> None:
        self.lines.append(line)


def _report(when: str, *props: tuple[str, str]) -> SimpleNamespace:
    return SimpleNamespace(when=when, user_properties=list(props))


def _config(tmp_path: Path, option: str | None) -> SimpleNamespace:
    return SimpleNamespace(
        getoption=lambda name: option,
        invocation_params=SimpleNamespace(args=("gates/", "-n", "6"), dir=tmp_path / "cwd"),
    )


def test_recorder_orders_rows_by_case_and_writes_the_record(tmp_path):
    config = _config(tmp_path, str(tmp_path / "rec.md"))
    recorder = RunRecorder(config)
    recorder.pytest_runtest_logreport(_report("call", row_property("concurrent-MAX_BATCH=3", ROWS[1], "w", [EXCUSE])))
    recorder.pytest_runtest_logreport(_report("setup", row_property("greedy-MAX_DRAFTS=4", ROWS[1], "w")))
    recorder.pytest_runtest_logreport(_report("call", ("other", "x"), row_property("greedy-MAX_BATCH=1", ROWS[0], "w")))
    recorder.pytest_runtest_logreport(_report("call", canary_property(CANARY)))
    term = _Terminal()
    recorder.pytest_terminal_summary(term)
    assert term.lines == [
        "== spec lever gate",
        gate_line(ROWS[0]),
        gate_line(ROWS[1]),
        canary_line(CANARY),
        f"canaries: 1 of {len(CANARIES)} caught",
        f"run record written to {tmp_path / 'rec.md'}",
    ]
    text = (tmp_path / "rec.md").read_text()
    assert text.endswith(render_record(HEADER, ROWS, [EXCUSE], [CANARY]).split("\n\n", 1)[1])
    assert "- command: `pytest gates/ -n 6`" in text and "- weights: w" in text
    assert f"- cases: 2 of {len(ALL_CASES)}\n- canaries: 1 of {len(CANARIES)} caught\n" in text
    assert "| concurrent-MAX_BATCH=3 | req-2 | 17 | 5 | 6 | 0.0123 | 0.0456 | 0.27 |" in text


def test_a_canary_not_caught_says_the_gate_cannot_see_it():
    blind = CanaryRow("trim-leak", "the trim leaking", "concurrent-MAX_DRAFTS=2", False, "pass")
    assert canary_line(blind) == (
        "spec lever canary: trim-leak on concurrent-MAX_DRAFTS=2: NOT CAUGHT (the gate cannot see it): pass"
    )


def test_recorder_writes_under_the_working_directory_by_default(tmp_path, monkeypatch):
    monkeypatch.delenv(RECORD_ENV, raising=False)
    recorder = RunRecorder(_config(tmp_path, None))
    recorder.pytest_runtest_logreport(_report("call", row_property("greedy-MAX_BATCH=1", ROWS[0], "w")))
    term = _Terminal()
    recorder.pytest_terminal_summary(term)
    written = list((tmp_path / "cwd" / "gate-records").glob("*.md"))
    assert len(written) == 1 and term.lines[-1] == f"run record written to {written[0]}"
    assert re.fullmatch(r"[0-9]{8}T[0-9]{6}Z-.+\.md", written[0].name)


def test_recorder_without_rows_writes_nothing(tmp_path):
    config = _config(tmp_path, str(tmp_path / "rec.md"))
    term = _Terminal()
    RunRecorder(config).pytest_terminal_summary(term)
    assert term.lines == [] and not (tmp_path / "rec.md").exists()


# ---- the conftest hooks, in real pytest sessions ----


@pytest.fixture
def inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.delenv("PEGAINFER_REQUIRE_SPEC_GATE", raising=False)
    monkeypatch.delenv(RECORD_ENV, raising=False)
    pytester.makeconftest(
        "from gates.conftest import *  # noqa: F403\n"
        "from gates.conftest import pytest_runtest_makereport  # noqa: F401\n"
    )
    return pytester


def test_require_spec_gate_turns_skips_into_failures(inner, monkeypatch):
    monkeypatch.setenv("PEGAINFER_TEST_MODEL_PATH", "/nonexistent")  # a half-set pair: gate_weights skips
    monkeypatch.delenv("PEGAINFER_DFLASH_TEST_MODEL_PATH", raising=False)
    inner.makepyfile("""
        import pytest

        def test_skipped():
            pytest.skip("no weights here")

        def test_weights(gate_weights):
            pass

        @pytest.mark.xfail(reason="known")
        def test_xfail():
            assert False
    """)
    inner.runpytest_subprocess().assert_outcomes(skipped=2, xfailed=1)
    monkeypatch.setenv("PEGAINFER_REQUIRE_SPEC_GATE", "1")
    result = inner.runpytest_subprocess()
    result.assert_outcomes(failed=1, errors=1, xfailed=1)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at setup of test_weights*",
            "*_SPEC_GATE=1 turns this skip into a failure*DFLASH_TEST_MODEL_PATH*unset*",
            "*_SPEC_GATE=1 turns this skip into a failure*no weights here*",
        ]
    )


def test_rows_from_xdist_workers_reach_the_controller(inner, tmp_path):
    inner.makepyfile("""
        import os
        import pytest
        from gates.cases import CASES
        from gates.run_record import row_property
        from trace_tools import RecordRow

        @pytest.mark.parametrize("case", CASES[::-1], ids=[c.id for c in CASES[::-1]])
        def test_case(case, request):
            row = RecordRow(case.child, case.env_label, 1, 2, None, 64, 0, True)
            request.node.user_properties.append(row_property(case.id, row, os.environ["PYTEST_XDIST_WORKER"]))
    """)
    record = tmp_path / "rec.md"
    result = inner.runpytest_subprocess("-n", "2", "--run-record", str(record))
    result.assert_outcomes(passed=len(CASES))
    result.stdout.fnmatch_lines(
        [f"spec lever gate: child={c.child} env={c.env_label} *" for c in CASES] + [f"run record written to {record}"]
    )
    table = [ln for ln in record.read_text().splitlines() if ln.startswith("| test_")]
    assert [ln.split(" | ")[1] for ln in table] == [c.env_label for c in CASES]
    assert "gw0" in record.read_text() and "gw1" in record.read_text()  # both workers' rows arrived
    assert f"- cases: {len(CASES)} of {len(ALL_CASES)}" in record.read_text()


def test_a_malformed_require_flag_stops_the_session(inner, monkeypatch):
    monkeypatch.setenv("PEGAINFER_REQUIRE_SPEC_GATE", "yes")
    inner.makepyfile("def test_x():\n    pass\n")
    result = inner.runpytest_subprocess()
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*PEGAINFER_REQUIRE_SPEC_GATE='yes' is not an unsigned decimal count*"])


def test_a_gate_session_runs_a_default_levers_childs_test_once(monkeypatch):
    """In a session that runs the levers gate, a lossless test that a default-levers case runs as its
    child is deselected in-process; a child's own session (no gate items) keeps it."""
    from gates.conftest import pytest_collection_modifyitems

    def item(nodeid: str, case=None):
        spec = SimpleNamespace(params={"case": case}) if case is not None else None
        return SimpleNamespace(nodeid=nodeid, name=nodeid.rsplit("::", 1)[1], callspec=spec)

    stop = next(c for c in ALL_CASES if c.id == "stop-default-levers")
    gated = next(c for c in ALL_CASES if c.id == "concurrent-MAX_BATCH=3")
    lossless = [item(f"gates/test_lossless.py::{n}") for n in (stop.child, gated.child)]
    gate = [item(f"gates/test_spec_levers.py::t[{c.id}]", c) for c in (stop, gated)]
    deselected = []
    config = SimpleNamespace(hook=SimpleNamespace(pytest_deselected=lambda items: deselected.extend(items)))
    items = lossless + gate
    pytest_collection_modifyitems(config, items)
    assert items == [lossless[1], *gate] and deselected == [lossless[0]]
    alone = list(lossless)
    pytest_collection_modifyitems(config, alone)
    assert alone == lossless
