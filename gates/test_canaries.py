"""The canaries: each gate case's checks shown able to fail. A canary's child runs with one known bug
planted (gates/canaries.py); its verdict must fail naming the invariant the bug breaks. A canary that
passes, or fails for another reason, fails here: the gate cannot see that bug."""

from __future__ import annotations

import pytest

from gates.canaries import CANARIES
from gates.gate_case import prepare, run_case
from gates.run_record import canary_line, canary_property
from trace_tools import CanaryRow


@pytest.mark.parametrize("name", list(CANARIES))
def test_the_gate_sees_the_planted_bug(name: str, gate_weights, request, tmp_path):
    canary = CANARIES[name]
    extra, _ = prepare(canary.case, None if canary.case.known else gate_weights)
    run, result = run_case(canary.case, extra, tmp_path, canary=name)
    named = next((p for p in result.problems if canary.expect in p), None)
    said = named or "; ".join(result.problems) or "pass"
    row = CanaryRow(name, canary.bug, canary.case.id, named is not None, said)
    print(canary_line(row))
    request.node.user_properties.append(canary_property(row))
    if named is None:
        pytest.fail(
            f"the gate cannot see {canary.bug}: canary {name} on {canary.case.id} expected a problem holding "
            f"{canary.expect!r}, the verdict said: {said}\nfull output: {run.log_path}",
            pytrace=False,
        )
