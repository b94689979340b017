"""The policy's in-engine host cost bench on the shipped tiny pair (CPU): one row per concurrency,
every round timed on one side, and the policy's methods restored afterwards (timing only: no
figure is asserted)."""

from __future__ import annotations

import csv

import pytest

from engine.bench import policy_cost_engine
from engine.policy.ahead import PolicyAhead
from engine.policy.span import SpanPolicy


def test_splits_the_policy_time_by_where_it_runs_and_restores_the_policy(tmp_path, one_thread):
    originals = {n: getattr(SpanPolicy, n) for n in policy_cost_engine.CRITICAL}
    originals |= {n: getattr(PolicyAhead, n) for n in policy_cost_engine.WINDOW}
    for flags in ([], ["--in-turn"]):
        out = tmp_path / f"cost{len(flags)}.csv"
        argv = ["--concurrency", "1", "2", "--new-tokens", "12", "--out", str(out), *flags]
        assert policy_cost_engine.main(argv) == 0
        rows = list(csv.DictReader(out.open()))
        assert [int(r["concurrency"]) for r in rows] == [1, 2] and all(int(r["rounds"]) > 0 for r in rows)
        assert all(float(r["critical_us"]) > 0 for r in rows)
        if not flags:  # speculative rounds plan ahead: the device's window holds the policy's work
            assert all(float(r["window_us"]) > 0 for r in rows)
    restored = {n: getattr(SpanPolicy, n) for n in policy_cost_engine.CRITICAL}
    restored |= {n: getattr(PolicyAhead, n) for n in policy_cost_engine.WINDOW}
    assert restored == originals


def test_refuses_more_prompts_than_the_pair_has():
    with pytest.raises(SystemExit, match="prompts"):
        policy_cost_engine.main(["--concurrency", "64"])


@pytest.mark.parametrize("argv", [["--concurrency", "0"], ["--new-tokens", "1"]])
def test_refuses_bad_values_before_any_engine(argv, monkeypatch):
    monkeypatch.setattr(policy_cost_engine, "measure", lambda *a: pytest.fail("an engine was built"))
    with pytest.raises(SystemExit, match="--concurrency must be >= 1 and --new-tokens >= 2"):
        policy_cost_engine.main(argv)
