"""Levers gate: each lossless child re-run with one lever set, its trace checked against the lever and
against the child's own requests. The hedge cases run on a Markov-head drafter (skipped with the
reason without one); the known-continuation cases on the bench-only pair, which their child builds."""

from __future__ import annotations

import os

import pytest

from engine.knobs import read_gate_knobs
from gates.cases import CASES, HEDGE_CASES, HEDGE_DRAFTER_ENV, KNOWN_CASES, LeverCase
from gates.child import CHILD_TIMEOUT_S, ChildSpec, child_spec, failure_message, run_child
from gates.run_record import REPO_ROOT, row_property
from gates.verdict import check_child, gate_line

PAIR_CASES = CASES + HEDGE_CASES


@pytest.mark.parametrize("case", PAIR_CASES, ids=[c.id for c in PAIR_CASES])
def test_spec_levers_keep_losslessness(case: LeverCase, gate_weights, request, tmp_path):
    extra, label = {}, gate_weights.label
    if case.expect.hedged:
        from gates.weights import hedge_drafter, hedge_label

        drafter, reason = hedge_drafter(gate_weights)
        if drafter is None:
            pytest.skip(reason)
        extra, label = {HEDGE_DRAFTER_ENV: drafter}, f"{label} + hedge drafter {hedge_label(drafter)}"
    _gate(case, child_spec(case, os.environ, extra_env=extra), label, request, tmp_path)


@pytest.mark.parametrize("case", KNOWN_CASES, ids=[c.id for c in KNOWN_CASES])
def test_known_pair_keeps_losslessness(case: LeverCase, request, tmp_path):
    """The real Qwen3-4B geometry on a CUDA device (the tiny shapes on CPU), modelled acceptance."""
    _gate(case, child_spec(case, os.environ), None, request, tmp_path)


def _gate(case: LeverCase, spec: ChildSpec, label: str | None, request, tmp_path) -> None:
    run = run_child(spec, REPO_ROOT, CHILD_TIMEOUT_S, tmp_path / "child.log")
    result = check_child(case, run.returncode, run.output, run.timeout_s, exact=read_gate_knobs().batch_invariant)
    print(gate_line(result.row))
    label = label or result.weights or "known-continuation pair (the child printed no [known] line)"
    request.node.user_properties.append(row_property(case.id, result.row, label))
    if result.problems:
        pytest.fail(failure_message(case, run, result.problems), pytrace=False)
