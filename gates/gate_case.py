"""Running one gate case's child and judging it: what the lever cases (gates/test_spec_levers.py)
and the canaries (gates/test_canaries.py) share."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine.knobs import read_gate_knobs
from gates.cases import HEDGE_DRAFTER_ENV, Expect, LeverCase
from gates.child import CHILD_TIMEOUT_S, ChildRun, child_spec, run_child
from gates.run_record import REPO_ROOT
from gates.verdict import CaseResult, check_child
from trace_tools import ExcuseRow

SERVE_PACKAGES = ("uvicorn", "starlette", "openai", "httpx")  # the serve and dev extras


def prepare(case: LeverCase, gate_weights) -> tuple[dict[str, str], str | None]:
    """(extra child environment, the run record's weights label) for a case; skips with the reason
    when the case cannot run here (no Markov-head drafter for a hedge case, no serve extras)."""
    if case.expect is Expect.SERVE:
        for name in SERVE_PACKAGES:
            pytest.importorskip(name, reason=f"{name} is not installed (pip install -e '.[serve,dev]')")
    if case.known or gate_weights is None:
        return {}, None
    if not case.expect.hedged:
        return {}, gate_weights.label
    from gates.weights import hedge_drafter, hedge_label

    drafter, reason = hedge_drafter(gate_weights)
    if drafter is None:
        pytest.skip(reason)
    return {HEDGE_DRAFTER_ENV: drafter}, f"{gate_weights.label} + hedge drafter {hedge_label(drafter)}"


def run_case(
    case: LeverCase, extra: dict[str, str], tmp_path: Path, canary: str | None = None
) -> tuple[ChildRun, CaseResult]:
    """Run the case's child (with canary `canary` planted, if given) and judge its output. The server
    runs default numerics whatever the gate's: batch-invariant numerics judge only the other cases."""
    spec = child_spec(case, os.environ, extra_env=extra, canary=canary)
    run = run_child(spec, REPO_ROOT, CHILD_TIMEOUT_S, tmp_path / "child.log")
    exact = read_gate_knobs().batch_invariant and case.expect is not Expect.SERVE
    return run, check_child(case, run.returncode, run.output, run.timeout_s, exact=exact)


def excuse_rows(case: LeverCase, result: CaseResult) -> list[ExcuseRow]:
    return [ExcuseRow(case.id, e) for e in result.excuses]
