"""The levers gate's checks fail on planted faults (real-format lines, no weights), and its plumbing works."""

from __future__ import annotations

import os
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from gates.devices import device_slug, worker_gpu
from gates.levers import (
    CASES,
    TAIL_LINES,
    ChildSpec,
    LeverCase,
    check_case,
    check_child,
    child_spec,
    failure_message,
    gate_line,
    run_child,
)
from trace_tools import RecordRow, levers_trace_rows, unresumed_requests

DATA = Path(__file__).resolve().parent / "data" / "trace"
CASE = {c.id: c for c in CASES}
LOSSLESS = "[lossless] test={} requests=4 compared_tokens=176 excused_divergences={}"


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
    assert any("req-0, req-2, req-3 speculated again" in p for p in found)


def test_one_resumed_request_does_not_excuse_another_that_accepts_nothing():
    lines = gated_phase(range(4), 3) + [rnd(0, 0, 7, 4), rnd(2, 0, 7, 0), rnd(0, 0, 7, 2), rnd(2, 0, 7, 0)]
    found = problems("concurrent-MAX_BATCH=3", lines)
    assert found == ["req-2 speculated again after being gated but never verified and accepted a draft"]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_child_that_printed_no_round_lines_fails(case):
    output = "\n".join(["[INFO] engine: loaded", LOSSLESS.format(case.child, 0), "."])
    result = check_child(case, 0, output)
    assert any("no DFlash round lines" in p for p in result.problems)
    assert not result.row.passed


def _good_output(case: LeverCase, excused: int = 0) -> str:
    return "\n".join([*GOOD["concurrent-MAX_BATCH=3"], LOSSLESS.format(case.child, excused)])


def test_child_exit_code_fails_even_with_a_good_trace():
    case = CASE["concurrent-MAX_BATCH=3"]
    assert check_child(case, 0, _good_output(case)).problems == ()
    assert check_child(case, 1, _good_output(case)).problems == (
        "the child exited 1: its lossless assertions or its setup failed",
    )
    assert check_child(case, None, _good_output(case), timeout_s=1800).problems == (
        "the child was killed after 1800 s",
    )


def test_child_without_a_lossless_line_fails():
    case = CASE["concurrent-MAX_BATCH=3"]
    output = "\n".join(GOOD["concurrent-MAX_BATCH=3"][:-4])  # the sample ends with its [lossless] line + 3
    assert "[lossless]" not in output
    result = check_child(case, 0, output)
    assert any("no [lossless] line" in p for p in result.problems)
    assert result.row.excused_divergences is None


def test_child_that_compared_no_tokens_fails():
    case = CASE["greedy-MAX_BATCH=1"]
    output = "\n".join(
        [*GOOD["greedy-MAX_BATCH=1"], "[lossless] test=t requests=0 compared_tokens=0 excused_divergences=0"]
    )
    assert check_child(case, 0, output).problems == ("the child's [lossless] lines compared 0 tokens",)


def test_unreadable_trace_is_a_problem_not_a_crash():
    case = CASE["greedy-MAX_BATCH=1"]
    output = "\n".join(
        [*GOOD["greedy-MAX_BATCH=1"], "[DEBUG] DFlash round request=req-0 gated=1", LOSSLESS.format(case.child, 0)]
    )
    found = check_child(case, 0, output).problems
    assert len(found) == 1 and found[0].startswith("unreadable trace: line 11")


def test_row_sums_excused_divergences_and_carries_the_verdict():
    case = CASE["concurrent-MAX_BATCH=3"]
    output = _good_output(case, excused=2) + "\n" + LOSSLESS.format(case.child, 1)
    row = check_child(case, 0, output).row
    rows = levers_trace_rows(GOOD["concurrent-MAX_BATCH=3"])
    assert row == RecordRow(
        case.child, "MAX_BATCH=3", sum(r.gated for r in rows), sum(not r.gated for r in rows), 7, 3, True
    )


def test_gate_line_format():
    row = RecordRow("test_greedy_matches_plain_greedy", "MAX_BATCH=1", 315, 0, None, 0, True)
    assert gate_line(row) == (
        "spec lever gate: child=test_greedy_matches_plain_greedy env=MAX_BATCH=1 "
        "gated_rounds=315 speculating_rounds=0 max_drafts=-"
    )
    assert gate_line(RecordRow("c", "MAX_DRAFTS=4", 0, 64, 4, 0, True)).endswith("max_drafts=4")


# ---- the cases and the child command ----


def test_the_six_cases_of_the_spec_in_order():
    assert [c.id for c in CASES] == [
        "greedy-MAX_BATCH=1",
        "greedy-MAX_DRAFTS=4",
        "concurrent-MAX_DRAFTS=4",
        "greedy-MAX_DRAFTS=2",
        "concurrent-MAX_DRAFTS=2",
        "concurrent-MAX_BATCH=3",
    ]
    assert CASE["concurrent-MAX_BATCH=3"].nodeid == "gates/test_lossless.py::test_concurrent_heterogeneous_is_lossless"


def test_child_spec_sets_one_knob_and_removes_the_others():
    base = {
        "PATH": "/bin",
        "CUDA_VISIBLE_DEVICES": "1",
        "PEGAINFER_TEST_MODEL_PATH": "/m",
        "PEGAINFER_SPEC_MAX_BATCH": "8",
        "PEGAINFER_SPEC_HEDGE": "2",
        "PEGAINFER_SPEC_HEDGE_AUTO": "1",
        "PYTEST_ADDOPTS": "-n 4",
        "PYTEST_XDIST_WORKER": "gw1",
        "PEGAINFER_TEST_LOG": "0",
    }
    before = dict(base)
    spec = child_spec(CASE["greedy-MAX_DRAFTS=4"], base, python="/py")
    assert base == before
    assert spec.argv == (
        "/py",
        "-m",
        "pytest",
        "gates/test_lossless.py::test_greedy_matches_plain_greedy",
        "-x",
        "-q",
        "-s",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:randomly",
        "-p",
        "no:xdist",
    )
    assert spec.env == {
        "PATH": "/bin",
        "CUDA_VISIBLE_DEVICES": "1",
        "PEGAINFER_TEST_MODEL_PATH": "/m",
        "PEGAINFER_SPEC_MAX_DRAFTS": "4",
        "PEGAINFER_TEST_LOG": "1",
        "PYTHONUNBUFFERED": "1",
    }
    assert set(spec.env_removed) == {
        "PEGAINFER_SPEC_MAX_BATCH",
        "PEGAINFER_SPEC_HEDGE",
        "PEGAINFER_SPEC_HEDGE_AUTO",
        "PYTEST_ADDOPTS",
        "PYTEST_XDIST_WORKER",
    }
    assert spec.shell(Path("/repo dir")).startswith("cd '/repo dir' && env -u PEGAINFER_SPEC_MAX_BATCH ")


def _script_spec(code: str) -> ChildSpec:
    return ChildSpec((sys.executable, "-c", textwrap.dedent(code)), dict(os.environ), {"X": "1"}, ())


def test_run_child_combines_streams_and_keeps_the_log(tmp_path):
    spec = _script_spec("""
        import sys
        print("[lossless] out")
        print("[DEBUG] DFlash round err", file=sys.stderr)
        sys.exit(3)
    """)
    run = run_child(spec, tmp_path, 60, tmp_path / "child.log")
    assert run.returncode == 3
    assert run.output.splitlines() == ["[lossless] out", "[DEBUG] DFlash round err"]
    assert (tmp_path / "child.log").read_text() == run.output


def test_run_child_timeout_kills_the_whole_group(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    spec = _script_spec(f"""
        import subprocess, sys, time
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        open({str(pidfile)!r}, "w").write(str(p.pid))
        print("started", flush=True)
        time.sleep(300)
    """)
    t0 = time.monotonic()
    run = run_child(spec, tmp_path, 3, tmp_path / "child.log")
    assert run.returncode is None and time.monotonic() - t0 < 60
    assert run.output.strip() == "started"
    grandchild = int(pidfile.read_text())
    for _ in range(50):  # reaped by init shortly after the kill
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"grandchild {grandchild} survived the timeout")


def test_failure_message_names_command_env_exit_code_and_tail(tmp_path):
    case = CASE["greedy-MAX_DRAFTS=2"]
    spec = child_spec(case, {"PATH": "/bin", "PEGAINFER_SPEC_HEDGE": "2"}, python="/py")
    output = "\n".join(f"line {i}" for i in range(100))
    run = SimpleNamespace(
        spec=spec, cwd=tmp_path, returncode=2, timeout_s=1800, output=output, log_path=tmp_path / "child.log"
    )
    msg = failure_message(case, run, ["the child exited 2: boom"])
    assert "  - the child exited 2: boom" in msg
    assert f"child: cd {tmp_path} && env -u PEGAINFER_SPEC_HEDGE PEGAINFER_SPEC_MAX_DRAFTS=2 " in msg
    assert (
        "env set: PEGAINFER_SPEC_MAX_DRAFTS=2 PEGAINFER_TEST_LOG=1 PYTHONUNBUFFERED=1; "
        "removed: PEGAINFER_SPEC_HEDGE" in msg
    )
    assert "exit code: 2" in msg
    assert msg.endswith("\n".join(f"line {i}" for i in range(100 - TAIL_LINES, 100)))
    assert f"line {99 - TAIL_LINES}\n" not in msg


# ---- devices ----


@pytest.mark.parametrize(
    "worker, environ, count, expected",
    [
        ("gw0", {}, 4, "0"),
        ("gw5", {}, 4, "1"),
        ("gw1", {}, 1, None),  # one GPU: nothing to spread
        ("gw1", {}, 0, None),  # no driver
        ("gw1", {"CUDA_VISIBLE_DEVICES": "3"}, 8, None),  # the user pinned one device
        ("gw1", {"CUDA_VISIBLE_DEVICES": ""}, 8, None),  # the user hid every GPU
        ("gw3", {"CUDA_VISIBLE_DEVICES": "4,5, 6"}, 8, "4"),  # the user's pool, not all GPUs
        ("master", {}, 4, None),
    ],
)
def test_worker_gpu(worker, environ, count, expected):
    assert worker_gpu(worker, environ, count) == expected


def test_device_slug():
    assert device_slug("NVIDIA H200") == "nvidia-h200"
    assert device_slug("NVIDIA GeForce RTX 4090 (24GB)") == "nvidia-geforce-rtx-4090-24gb"
    assert device_slug("cpu (x86_64)") == "cpu"
