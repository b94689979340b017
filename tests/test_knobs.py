"""Every PEGAINFER_SPEC_* value of SPEC 2.6 through the real start path (Engine construction)."""

from __future__ import annotations

import os

import pytest

from engine import Engine, EngineConfig
from engine.knobs import KnobError, read_knobs

GOOD = [(None, 0), ("0", 0), ("+2", 2), ("007", 7), ("3", 3), (str(2**64 - 1), 2**64 - 1)]
BAD = ["", " ", " 2", "2 ", "-1", "2.0", "1e3", "0x10", "4_0", "four", str(2**64), "٣", "+", "++2", "2,3"]
LEVERS = ["PEGAINFER_SPEC_MAX_BATCH", "PEGAINFER_SPEC_MAX_DRAFTS"]


@pytest.mark.parametrize("var", LEVERS)
@pytest.mark.parametrize(("raw", "value"), GOOD)
def test_good_values_start(monkeypatch, tiny_target, tiny_drafter, var, raw, value):
    if raw is not None:
        monkeypatch.setenv(var, raw)
    engine = Engine(EngineConfig(model=str(tiny_target), draft_model=str(tiny_drafter), device="cpu"))
    got = engine.levers.max_batch if var.endswith("BATCH") else engine.levers.max_drafts
    assert got == value


@pytest.mark.parametrize("var", LEVERS)
@pytest.mark.parametrize("raw", BAD)
def test_bad_values_refuse_to_start_before_weights(monkeypatch, var, raw):
    monkeypatch.setenv(var, raw)
    # The checkpoint does not exist: the knob error must come first.
    with pytest.raises(KnobError) as err:
        Engine(EngineConfig(model="/nonexistent/checkpoint", device="cpu"))
    assert var in str(err.value) and repr(raw) in str(err.value)


@pytest.mark.parametrize("var", LEVERS)
def test_non_utf8_bytes_refuse_to_start(monkeypatch, var):
    monkeypatch.setitem(os.environb, var.encode(), b"\xff3")
    with pytest.raises(KnobError, match=f"{var}=.*not valid UTF-8"):
        Engine(EngineConfig(model="/nonexistent/checkpoint", device="cpu"))


def test_bad_knob_refuses_even_on_an_engine_without_drafter(monkeypatch, tiny_target):
    monkeypatch.setenv("PEGAINFER_SPEC_MAX_DRAFTS", "-1")
    with pytest.raises(KnobError):
        Engine(EngineConfig(model=str(tiny_target), device="cpu"))


def test_knobs_have_no_effect_without_a_drafter(monkeypatch, tiny_target):
    monkeypatch.setenv("PEGAINFER_SPEC_MAX_BATCH", "1")
    monkeypatch.setenv("PEGAINFER_SPEC_MAX_DRAFTS", "2")
    engine = Engine(EngineConfig(model=str(tiny_target), device="cpu"))
    out = engine.generate([[1, 2, 3], [4, 5]])
    assert all(o.finished for o in out) and engine.stats.rounds == 0


def test_explicit_options_win_over_the_environment(monkeypatch, tiny_target, tiny_drafter):
    monkeypatch.setenv("PEGAINFER_SPEC_MAX_BATCH", "3")
    monkeypatch.setenv("PEGAINFER_SPEC_MAX_DRAFTS", "2")
    engine = Engine(
        EngineConfig(
            model=str(tiny_target),
            draft_model=str(tiny_drafter),
            device="cpu",
            levers={"max_batch": 0, "max_drafts": 4},
        )
    )
    assert (engine.levers.max_batch, engine.levers.max_drafts) == (0, 4)


def test_unknown_spec_variable_is_refused():
    with pytest.raises(KnobError, match="unknown variable PEGAINFER_SPEC_MAX_BATHC"):
        read_knobs({"PEGAINFER_SPEC_MAX_BATHC": "2"})


@pytest.mark.parametrize("raw", ["", "0,1,x", "1,,2", "-1"])
def test_hedge_positions_list_is_validated(raw):
    with pytest.raises(KnobError, match="PEGAINFER_SPEC_HEDGE_POSITIONS"):
        read_knobs({"PEGAINFER_SPEC_HEDGE_POSITIONS": raw})


def test_hedge_positions_and_flags_parse():
    knobs = read_knobs({"PEGAINFER_SPEC_HEDGE_POSITIONS": "0,+1,002", "PEGAINFER_SPEC_HEDGE_AUTO": "1"})
    assert knobs.levers.hedge_positions == (0, 1, 2) and knobs.levers.hedge_auto


@pytest.mark.parametrize("raw", ["2", "yes", "true"])
def test_flags_accept_only_0_or_1(raw):
    with pytest.raises(KnobError, match="PEGAINFER_TEST_LOG"):
        read_knobs({"PEGAINFER_TEST_LOG": raw})
