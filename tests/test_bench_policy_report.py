"""The adaptive arm's comparison with the static arms, on sweep rows of the real format."""

from __future__ import annotations

import pytest

from engine.bench.policy_report import adaptive_markdown, adaptive_rows, best_single_static, span_counts
from engine.bench.summary import add_paired_ratios, summarize
from tests.sweep_rows import sweep_row

ADAPTIVE = "spec+policy=adaptive"
ARMS = ["plain", "spec", "spec+trim=4", "spec+gate=8", ADAPTIVE, "plain#2", "spec#2"]
# tok/s per (c, arm) in round 1; round 2 is the same times `slow` for every arm (a slow round).
TOK = {
    1: {"plain": 100, "spec": 300, "spec+trim=4": 250, ADAPTIVE: 295, "plain#2": 101, "spec#2": 303},
    8: {"plain": 400, "spec": 380, "spec+trim=4": 480, "spec+gate=8": 405, ADAPTIVE: 478, "plain#2": 396},
    16: {"plain": 600, "spec": 300, "spec+trim=4": 540, "spec+gate=8": 598, ADAPTIVE: 560, "plain#2": 606},
}


@pytest.fixture
def swept():
    choices = {1: "15:40", 8: "4:30 15:2", 16: "0:20 2:12"}
    rows = [
        sweep_row(c, rnd, arm, tok * slow, choices[c] if arm == ADAPTIVE else "")
        for c, arms in TOK.items()
        for rnd, slow in ((1, 1.0), (2, 0.5))
        for arm, tok in arms.items()
    ]
    add_paired_ratios(rows)
    return rows, summarize(rows, ARMS)


def test_the_adaptive_arm_against_the_best_static_arm_per_c(swept):
    rows, summary = swept
    got = {g["concurrency"]: g for g in adaptive_rows(rows, summary, ADAPTIVE)}
    assert [got[c]["best_static"] for c in (1, 8, 16)] == ["spec", "spec+trim=4", "plain"]
    assert got[1]["vs_best"] == pytest.approx(295 / 300) and got[16]["vs_plain"] == pytest.approx(560 / 600)
    assert all(got[c]["noise"] == pytest.approx(0.01) for c in got)  # plain#2's and spec#2's spread
    assert not got[1]["ok_best"] and got[1]["ok_plain"]  # -1.7 % of spec, beyond a 1 % floor
    assert got[8]["ok_best"] and got[8]["ok_plain"]  # -0.4 % of trim=4, within it
    assert not got[16]["ok_best"] and not got[16]["ok_plain"]  # -6.7 % of plain
    assert got[8]["vs_single"] == pytest.approx(478 / 405)  # against spec+gate=8, the best single setting


def test_the_best_single_static_setting_takes_a_gate_arm_as_spec_below_its_gate(swept):
    _, summary = swept
    label, gmean = best_single_static(summary)
    # trim=4: 2.5, 1.2, 0.9; gate=8 (spec at c=1): 3.0, 1.0125, 0.9967; spec: 3.0, 0.95, 0.5; plain: 1.
    assert label == "spec+gate=8"
    assert gmean == pytest.approx((3.0 * 405 / 400 * 598 / 600) ** (1 / 3))


def test_the_k_histogram_and_the_markdown(swept):
    rows, summary = swept
    assert span_counts(rows, 8, ADAPTIVE) == {4: 60, 15: 4}  # pooled over both rounds
    text = adaptive_markdown(rows, summary)
    assert "`spec+policy=adaptive` against the static arms" in text
    assert "4: 94% · 15: 6%" in text and "Best single static setting over the range: `spec+gate=8`" in text
    assert adaptive_markdown(rows, summarize(rows, ARMS[:4])) == ""
