"""The speculative arms' own noise floor (spec#2): verdicts are taken against the noise of their kind."""

from __future__ import annotations

import pytest

from engine.bench.arms import parse_arms
from engine.bench.summary import add_paired_ratios, noise_floors, summarize
from tests.sweep_rows import sweep_row


def test_spec_noise_arm_is_added_with_spec():
    labels = [a.label for a in parse_arms(["plain", "spec+trim=4"], noise_arm=True, spec_noise_arm=True)]
    assert labels == ["plain", "spec+trim=4", "plain#2", "spec", "spec#2"]
    assert [a.label for a in parse_arms(["spec"], spec_noise_arm=True)] == ["plain", "spec", "spec#2"]
    with pytest.raises(ValueError, match="given twice"):
        parse_arms(["spec", "spec"], spec_noise_arm=True)


def test_speculative_verdicts_use_the_larger_of_both_floors():
    # plain#2 within 2 % of plain; spec#2 30 % above spec in round 1: the speculative spread is wider.
    table = {1: (100, 102, 150, 195, 120), 2: (100, 99, 160, 160, 125)}
    rows = []
    for rnd, (plain, plain2, spec, spec2, trim) in table.items():
        arms = {"plain": plain, "plain#2": plain2, "spec": spec, "spec#2": spec2, "spec+trim=4": trim}
        rows += [sweep_row(4, rnd, arm, tok_s) for arm, tok_s in arms.items()]
    add_paired_ratios(rows)
    assert noise_floors(rows)[4] == pytest.approx(0.02)
    assert noise_floors(rows, "spec#2", "spec")[4] == pytest.approx(0.3)
    summary = {s["arm"]: s for s in summarize(rows, ["plain", "plain#2", "spec", "spec#2", "spec+trim=4"])}
    assert summary["plain"]["noise_floor"] == pytest.approx(0.02)
    assert summary["spec+trim=4"]["noise_floor"] == pytest.approx(0.3)
    assert summary["spec+trim=4"]["verdict"] == "parity"  # +22.5 % is inside the speculative noise
    assert summary["spec"]["verdict"] == "win"  # +55 % is not
    assert summary["spec#2"]["verdict"] == "noise"
