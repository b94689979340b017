"""Levers gate: each lossless child re-run with one lever set, its trace checked against the lever and
against the child's own requests. The hedge cases run on a Markov-head drafter (skipped with the
reason without one); the known-continuation cases on the bench-only pair, which their child builds;
the capture and server children build their engines (and the server) themselves."""

from __future__ import annotations

import pytest

from gates.cases import (
    CAPTURE_CASES,
    CASES,
    COMBO_CASES,
    HEDGE_CASES,
    KNOWN_CASES,
    PENALTY_CASES,
    RAGGED_CASES,
    LeverCase,
)
from gates.child import failure_message
from gates.gate_case import excuse_rows, prepare, run_case
from gates.run_record import row_property
from gates.verdict import gate_line

PAIR_CASES = CASES + COMBO_CASES + PENALTY_CASES + CAPTURE_CASES + HEDGE_CASES


@pytest.mark.parametrize("case", PAIR_CASES, ids=[c.id for c in PAIR_CASES])
def test_spec_levers_keep_losslessness(case: LeverCase, gate_weights, request, tmp_path):
    _gate(case, gate_weights, request, tmp_path)


@pytest.mark.parametrize("case", KNOWN_CASES + RAGGED_CASES, ids=[c.id for c in KNOWN_CASES + RAGGED_CASES])
def test_known_pair_keeps_losslessness(case: LeverCase, request, tmp_path):
    """The real Qwen3-4B geometry on a CUDA device (the tiny shapes on CPU), modelled acceptance."""
    _gate(case, None, request, tmp_path)


def _gate(case: LeverCase, gate_weights, request, tmp_path) -> None:
    extra, label = prepare(case, gate_weights)
    run, result = run_case(case, extra, tmp_path)
    print(gate_line(result.row))
    label = label or result.weights or "known-continuation pair (the child printed no [known] line)"
    request.node.user_properties.append(row_property(case.id, result.row, label, excuse_rows(case, result)))
    if result.problems:
        pytest.fail(failure_message(case, run, result.problems), pytrace=False)
