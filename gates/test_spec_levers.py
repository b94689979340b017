"""Levers gate: each lossless child re-run with one lever set, its trace checked against the lever."""
from __future__ import annotations

import os

import pytest

from gates.levers import (
    CASES,
    CHILD_TIMEOUT_S,
    LeverCase,
    check_child,
    child_spec,
    failure_message,
    gate_line,
    run_child,
)
from gates.run_record import REPO_ROOT, row_property


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_spec_levers_keep_losslessness(case: LeverCase, gate_weights, request, tmp_path):
    run = run_child(child_spec(case, os.environ), REPO_ROOT, CHILD_TIMEOUT_S, tmp_path / "child.log")
    result = check_child(case, run.returncode, run.output, run.timeout_s)
    print(gate_line(result.row))
    request.node.user_properties.append(row_property(case.id, result.row, gate_weights.label))
    if result.problems:
        pytest.fail(failure_message(case, run, result.problems), pytrace=False)
