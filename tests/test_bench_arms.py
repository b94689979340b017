"""Lever-arm parsing, round rotation and the parity verdict of the sweep."""

from __future__ import annotations

import pytest

from engine.bench.arms import NOISE_ARM, parse_arm, parse_arms, round_order, verdict
from engine.bench.summary import add_paired_ratios, noise_floors


def test_parse_arm_levers():
    assert parse_arm("plain") == parse_arm("plain")
    a = parse_arm("spec+trim=4+gate=32")
    assert (a.kind, a.trim, a.gate, a.label) == ("spec", 4, 32, "spec+trim=4+gate=32")
    assert (parse_arm("spec").trim, parse_arm("spec").gate) == (0, 0)
    assert parse_arm("spec+gate=8").gate == 8
    dup = parse_arm("plain#2")
    assert dup.is_plain and dup.label == "plain#2"
    a = parse_arm("spec+policy=adaptive+trim=8")
    assert a.adaptive and a.levers() == {"max_batch": 0, "max_drafts": 8, "hedge": 0, "policy": "adaptive"}
    assert parse_arm("spec").levers()["policy"] == "static" and not parse_arm("spec+policy=static").adaptive


@pytest.mark.parametrize(
    "bad, words",
    [
        ("spec+trim=x", "bad lever 'trim=x'"),
        ("spec+trim=-1", "bad lever"),
        ("spec+trim=0", "must be >= 1"),
        ("spec+gate=", "bad lever"),
        ("spec+depth=2", "bad lever 'depth=2'"),
        ("spec+trim=2+trim=4", "trim given twice"),
        ("plain+trim=2", "plain takes no levers"),
        ("specc", "unknown arm 'specc'"),
        ("", "unknown arm"),
        ("spec#", "tag"),
        ("spec+policy=fast", "policy='fast'; expected one of static|adaptive"),
        ("spec+policy=", "policy=''; expected one of"),
        ("spec+policy=Adaptive", "expected one of static|adaptive"),
        ("spec+policy=adaptive+policy=static", "policy given twice"),
        ("plain+policy=adaptive", "plain takes no levers"),
        ("spec+adaptive", "bad lever 'adaptive'"),
    ],
)
def test_parse_arm_errors_name_the_problem(bad, words):
    with pytest.raises(ValueError, match="arm") as err:
        parse_arm(bad)
    assert words in str(err.value)


def test_parse_arms_adds_plain_and_noise_and_refuses_duplicates():
    labels = [a.label for a in parse_arms(["spec", "spec+trim=2"], noise_arm=True)]
    assert labels == ["plain", "spec", "spec+trim=2", NOISE_ARM]
    assert [a.label for a in parse_arms(["spec", "plain"])] == ["spec", "plain"]
    with pytest.raises(ValueError, match="given twice"):
        parse_arms(["plain", "spec", "spec"])


def test_round_order_rotates_the_start_arm():
    arms = parse_arms(["plain", "spec", "spec+trim=2"])
    starts = [round_order(arms, r)[0].label for r in range(4)]
    assert starts == ["plain", "spec", "spec+trim=2", "plain"]
    assert [a.label for a in round_order(arms, 1)] == ["spec", "spec+trim=2", "plain"]


@pytest.mark.parametrize(
    "ratio, floor, bar, expected",
    [
        (1.018, 0.022, 0.0, "parity"),  # the upstream c32 trim cell: +1.8 % under a 2.2 % floor
        (1.018, 0.003, 0.02, "parity"),  # under the 2 % bar even with a tight floor
        (1.046, 0.022, 0.02, "win"),
        (0.935, 0.022, 0.02, "loss"),
        (1.022, 0.022, 0.0, "parity"),  # exactly the floor is not a claim
        (1.03, None, 0.0, "win"),  # no noise arm, no bar: any difference counts
        (1.0, None, 0.0, "parity"),
    ],
)
def test_verdict(ratio, floor, bar, expected):
    assert verdict(ratio, floor, bar) == expected


def test_paired_ratio_uses_the_same_round_and_noise_floor_is_the_spread():
    rows = [
        {"concurrency": 4, "round": 1, "arm": "plain", "tok_s": 100.0},
        {"concurrency": 4, "round": 1, "arm": "plain#2", "tok_s": 103.0},
        {"concurrency": 4, "round": 1, "arm": "spec", "tok_s": 150.0},
        {"concurrency": 4, "round": 2, "arm": "plain", "tok_s": 50.0},  # a slow round hits every arm alike
        {"concurrency": 4, "round": 2, "arm": "plain#2", "tok_s": 49.0},
        {"concurrency": 4, "round": 2, "arm": "spec", "tok_s": 76.0},
    ]
    add_paired_ratios(rows)
    assert [round(r["ratio_vs_plain"], 6) for r in rows] == [1.0, 1.03, 1.5, 1.0, 0.98, 1.52]
    assert noise_floors(rows) == {4: pytest.approx(0.03)}
