"""The gate, test and path variables: read once through engine.knobs, refused with a clear error."""

from __future__ import annotations

import pytest

from engine.fixture.cache import cache_root
from engine.knobs import GateKnobs, KnobError, read_gate_knobs
from engine.provenance import git_commit


def test_unset_is_the_default_and_every_variable_is_read():
    assert read_gate_knobs({}) == GateKnobs()
    env = {
        "PEGAINFER_TEST_MODEL_PATH": "/w/target",
        "PEGAINFER_DFLASH_TEST_MODEL_PATH": "org/drafter",
        "PEGAINFER_TEST_HEDGE_DRAFTER": "~/dspark",
        "PEGAINFER_REQUIRE_SPEC_GATE": "1",
        "PEGAINFER_TEST_BATCH_INVARIANT": "+1",
        "PEGAINFER_TEST_LOG": "0",
        "PEGAINFER_RUN_RECORD": "/out/rec.md",
        "PEGASPEC_CACHE": "/cache",
        "PEGASPEC_COMMIT": "abc1234",
    }
    assert read_gate_knobs(env) == GateKnobs(
        "/w/target", "org/drafter", "~/dspark", True, True, False, "/out/rec.md", "/cache", "abc1234"
    )


def test_a_blank_path_is_unset():
    assert read_gate_knobs({"PEGAINFER_TEST_MODEL_PATH": "  ", "PEGASPEC_COMMIT": ""}) == GateKnobs()


@pytest.mark.parametrize(
    "name, raw, why",
    [
        ("PEGAINFER_REQUIRE_SPEC_GATE", "yes", "is not an unsigned decimal count"),
        ("PEGAINFER_REQUIRE_SPEC_GATE", "2", "must be 0 or 1"),
        ("PEGAINFER_TEST_BATCH_INVARIANT", "-1", "is not an unsigned decimal count"),
        ("PEGASPEC_CACHE", "/a\0b", "holds a NUL byte"),
        ("PEGAINFER_RUN_RECORD", "/r\udcff.md", "is not valid UTF-8"),
    ],
)
def test_bad_values_are_refused_naming_the_variable(name, raw, why):
    with pytest.raises(KnobError, match=why) as err:
        read_gate_knobs({name: raw})
    assert name in str(err.value)


def test_the_shipped_commit_wins_over_git_and_an_empty_environment_asks_git(tmp_path):
    assert git_commit(repo=tmp_path, environ={"PEGASPEC_COMMIT": "abc1234"}) == "abc1234"
    assert git_commit(repo=tmp_path, environ={}) is None  # no .git here


def test_the_fixture_cache_root_comes_from_the_knob(tmp_path, monkeypatch):
    monkeypatch.setenv("PEGASPEC_CACHE", str(tmp_path / "cache"))
    assert cache_root() == tmp_path / "cache" and (tmp_path / "cache").is_dir()
