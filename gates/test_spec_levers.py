"""Levers gate: each lossless child re-run with one lever set, its trace checked against the lever and
against the child's own requests. The hedge cases run on a Markov-head drafter (skipped with the
reason without one)."""

from __future__ import annotations

import os

import pytest

from engine.knobs import read_gate_knobs
from gates.cases import ALL_CASES, HEDGE_DRAFTER_ENV, LeverCase
from gates.child import CHILD_TIMEOUT_S, child_spec, failure_message, run_child
from gates.run_record import REPO_ROOT, row_property
from gates.verdict import check_child, gate_line


@pytest.mark.parametrize("case", ALL_CASES, ids=[c.id for c in ALL_CASES])
def test_spec_levers_keep_losslessness(case: LeverCase, gate_weights, request, tmp_path):
    extra, label = {}, gate_weights.label
    if case.expect.hedged:
        from gates.weights import hedge_drafter, hedge_label

        drafter, reason = hedge_drafter(gate_weights)
        if drafter is None:
            pytest.skip(reason)
        extra, label = {HEDGE_DRAFTER_ENV: drafter}, f"{label} + hedge drafter {hedge_label(drafter)}"
    run = run_child(child_spec(case, os.environ, extra_env=extra), REPO_ROOT, CHILD_TIMEOUT_S, tmp_path / "child.log")
    result = check_child(case, run.returncode, run.output, run.timeout_s, exact=read_gate_knobs().batch_invariant)
    print(gate_line(result.row))
    request.node.user_properties.append(row_property(case.id, result.row, label))
    if result.problems:
        pytest.fail(failure_message(case, run, result.problems), pytrace=False)
