"""The canary table (gates/canaries.py): every patch target resolves on this tree, every canary runs on a
gate case, a planted patch changes what it names and nothing else, and a canary child is started with its
bug planted before the child's own module runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gates import canaries
from gates.canaries import CANARIES, ENV, Canary
from gates.cases import ALL_CASES, CASES
from gates.child import child_spec
from gates.plant import CanaryError, canary_argv, plant, resolve

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", list(CANARIES))
def test_every_canary_targets_what_exists_and_runs_on_a_gate_case(name):
    canary = CANARIES[name]
    assert canary.name == name and canary.case in ALL_CASES and canary.expect and canary.bug
    for target in canary.targets:
        resolve(target)  # a refactor that moved it fails here: retarget gates/canaries.py


def test_the_table_covers_the_planted_fault_classes_the_issue_asks_for():
    assert {
        "gated-capture-lost",
        "gated-row-unstored",
        "trim-leak",
        "stop-token-overrun",
        "stop-string-overrun",
        "wrong-token-past-64",
        "gated-flag-lies",
        "budget-overrun",
    } <= set(CANARIES)
    assert canaries.WRONG_AT > 64


def test_a_target_that_moved_is_named():
    with pytest.raises(CanaryError, match="engine.round:no_such_function is gone.*retarget gates/canaries.py"):
        resolve("engine.round:no_such_function")
    with pytest.raises(CanaryError, match="engine.no_such_module:x is gone"):
        resolve("engine.no_such_module:x")


def test_plant_replaces_exactly_the_targets(monkeypatch):
    import torch

    import engine.policy.choice as choice
    import engine.round as rounds
    import engine.staging as staging

    monkeypatch.setattr(choice, "round_drafts", choice.round_drafts)  # undone after the test
    monkeypatch.setattr(rounds, "draft_limit", rounds.draft_limit)
    monkeypatch.setattr(staging, "draft_limit", staging.draft_limit)
    budgets = torch.tensor([3, 1, 9])
    assert (choice.round_drafts(7, 2), rounds.draft_limit(7, 3)) == (2, 2)
    assert staging.draft_limit(7, budgets).tolist() == [2, 0, 7]
    plant("trim-leak")
    assert (choice.round_drafts(7, 2), choice.round_drafts(7, 0), rounds.draft_limit(7, 3)) == (3, 7, 2)
    plant("budget-overrun")  # the host's limits and those staged on the device for a round launched ahead
    assert rounds.draft_limit(7, 3) == 3 and staging.draft_limit(7, budgets).tolist() == [3, 1, 7]


def test_the_stop_canary_lets_an_accepted_run_go_on_past_its_stop_token(monkeypatch):
    from engine.config import SamplingParams
    from engine.request import Request

    monkeypatch.setattr(Request, "_commit", Request._commit)
    plain = Request(0, [1], SamplingParams(max_tokens=8), frozenset({5}))
    assert plain._commit([4, 5, 6]) == 2 and plain.output_ids == [4, 5]
    plant("stop-token-overrun")
    planted = Request(0, [1], SamplingParams(max_tokens=8), frozenset({5}))
    assert planted._commit([4, 5, 6]) == 3 and planted.output_ids == [4, 5, 6] and not planted.finished
    assert planted._commit([5]) == 1 and planted.finished  # a one-token commit still stops


def test_a_canary_child_plants_its_bug_then_runs_the_childs_module():
    spec = child_spec(CASES[0], {"PATH": "/bin", ENV: "stale"}, python="/py", canary="trim-leak")
    assert spec.argv[:5] == ("/py", "-m", "gates.plant", "trim-leak", "-m")
    assert spec.argv[5:] == child_spec(CASES[0], {}, python="/py").argv[2:]
    assert ENV not in spec.env and ENV in spec.env_removed  # the runner sets it, a stale one never reaches it
    assert canary_argv("x", ("/py", "-m", "m", "a")) == ("/py", "-m", "gates.plant", "x", "-m", "m", "a")


def test_the_canary_runner_plants_before_the_module_runs(tmp_path):
    probe = tmp_path / "probe_mod.py"
    probe.write_text(
        f"import engine.round as r, os, sys\nprint('limit', r.draft_limit(7, 3), sys.argv[1:], os.environ[{ENV!r}])\n"
    )
    env = {"PYTHONPATH": f"{ROOT}:{tmp_path}", "PATH": "/usr/bin:/bin"}
    run = [sys.executable, "-m", "gates.plant"]
    out = subprocess.run(
        [*run, "budget-overrun", "-m", "probe_mod", "x"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "limit 3 ['x'] budget-overrun"
    bad = subprocess.run([*run, "no-such-canary", "-m", "probe_mod"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert bad.returncode != 0 and "usage: python -m gates.plant" in bad.stderr


def test_a_canary_is_a_plain_record():
    c = CANARIES["trace-silent"]
    assert isinstance(c, Canary) and c.targets == ("engine.trace:TRACE",)
