"""The levers gate on the known-continuation pair: its child (gates/known_child.py), the `[known]` line,
and the verdict, which fails on a corrupted output and on a drafter whose drafts are all accepted or
all rejected (a check without power)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

import engine.request
from gates import known_child
from gates.cases import KNOWN, KNOWN_CASES, MODULES
from gates.checks import check_case
from gates.child import child_spec
from gates.verdict import check_child
from trace_tools import KnownLine, TraceError, known_lines, levers_trace_rows

DATA = Path(__file__).resolve().parent / "data" / "trace"
CASE = {c.id: c for c in KNOWN_CASES}
DEFAULT = CASE["known-default-levers"]


def recorded() -> str:
    """A real CPU run of `python -m gates.known_child` (tiny shapes, `code` profile, default levers)."""
    return (DATA / "known-default.log").read_text()


def test_the_known_line_as_the_child_prints_it():
    line = known_child.known_line("4b", "code", 8, 344, 1, 0)
    assert known_lines(["noise", line]) == [KnownLine("4b", "code", 8, 344, 1, 0)]
    with pytest.raises(TraceError, match="geometry="):
        known_lines(["[known] profile=code requests=1 compared_tokens=2 mismatches=0 plain_mismatches=0"])
    with pytest.raises(TraceError, match="plain_mismatches="):
        known_lines(["[known] geometry=tiny profile=code requests=1 compared_tokens=2 mismatches=0"])


def test_the_cases_run_the_known_child_with_their_knobs():
    assert [c.id for c in KNOWN_CASES] == [
        "known-default-levers",
        "known-MAX_DRAFTS=4",
        "known-MAX_BATCH=3",
        "known-POLICY=adaptive-COST_TABLE=gates/data/adaptive-loss.csv",
    ]
    spec = child_spec(CASE["known-MAX_BATCH=3"], {"PATH": "/bin", "PEGAINFER_SPEC_MAX_DRAFTS": "2"}, python="/py")
    assert spec.argv == ("/py", "-m", MODULES[KNOWN])
    assert spec.env["PEGAINFER_SPEC_MAX_BATCH"] == "3" and "PEGAINFER_SPEC_MAX_DRAFTS" not in spec.env
    assert spec.env["PEGAINFER_TEST_LOG"] == "1"


# ---- the verdict on a recorded real child output ----


def test_a_recorded_known_child_passes_with_both_accepted_and_rejected_drafts():
    result = check_child(DEFAULT, 0, recorded())
    assert result.problems == ()
    assert (result.compared_tokens, result.excused) == (408, 0)
    assert result.weights == "known:tiny + modelled drafter (code)"
    rows = levers_trace_rows(recorded().splitlines())
    assert 0 < sum(r.accepted_draft for r in rows) < sum(r.verified_draft for r in rows)


@pytest.mark.parametrize(
    "old, new, problem",
    [
        ("mismatches=0 plain", "mismatches=1 plain", "1 of 8 speculative outputs left the known continuation"),
        ("plain_mismatches=0", "plain_mismatches=2", "the tiny target does not echo"),
        ("compared_tokens=408 mismatches", "compared_tokens=300 mismatches", "part of the output went unchecked"),
    ],
)
def test_a_known_line_that_reports_a_fault_fails_the_case(old, new, problem):
    result = check_child(DEFAULT, 0, recorded().replace(old, new))
    assert any(problem in p for p in result.problems), result.problems


def test_a_child_without_its_known_line_fails():
    text = "\n".join(ln for ln in recorded().splitlines() if "[known]" not in ln)
    assert any("0 [known] lines" in p for p in check_child(DEFAULT, 0, text).problems)


def test_drafts_all_accepted_or_all_rejected_leave_the_check_without_power():
    rows = levers_trace_rows(recorded().splitlines())
    everything = [replace(r, accepted_draft=r.verified_draft, committed_tokens=r.verified_draft + 1) for r in rows]
    nothing = [replace(r, accepted_draft=0, committed_tokens=1) for r in rows]
    assert check_case(DEFAULT, rows) == []
    assert any("were all accepted (" in p for p in check_case(DEFAULT, everything))
    assert any("were none accepted (0 of" in p for p in check_case(DEFAULT, nothing))
    # The same rule holds under every lever of the pair, trim and gate included.
    assert any("were all accepted" in p for p in check_case(CASE["known-MAX_DRAFTS=4"], everything))


# ---- the child itself, in process (tiny shapes on CPU) ----


@pytest.mark.usefixtures("one_thread")
def test_a_corrupted_committed_token_fails_the_case(monkeypatch, capsys):
    """The planted fault: the first speculative round commits its last accepted draft flipped (token ^ 1).
    The [known] line counts the request, the lossless check stops the child, the case fails."""
    real, hits = engine.request.Request.advanced, []

    def corrupt(self, accepted, bonus, keep_context):
        if accepted and not hits:
            hits.append(self.id)
            accepted = [*accepted[:-1], accepted[-1] ^ 1]
        return real(self, accepted, bonus, keep_context)

    monkeypatch.setattr(engine.request.Request, "advanced", corrupt)
    monkeypatch.setenv("PEGAINFER_TEST_LOG", "1")
    rc = known_child.main([])
    out = capsys.readouterr()
    assert len(hits) == 1 and rc == 1
    problems = check_child(DEFAULT, rc, out.out + out.err).problems
    assert "1 of 8 speculative outputs left the known continuation" in problems
    assert "the child exited 1: its lossless assertions or its setup failed" in problems


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--profile", "math"], "--profile: acceptance profile 'math'"),
        (["--seed", "-1"], "--seed -1: expected a seed >= 0"),
    ],
)
def test_the_child_refuses_bad_options(argv, message):
    with pytest.raises(SystemExit, match=message):
        known_child.main(argv)


def test_the_child_refuses_an_unknown_geometry(capsys):
    with pytest.raises(SystemExit):
        known_child.main(["--geometry", "7b"])
    assert "invalid choice: '7b'" in capsys.readouterr().err
