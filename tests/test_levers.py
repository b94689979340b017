"""The one levers type: every source (environment, EngineConfig.levers, set_levers, CLI flags) is
validated by the same rules and refuses the same malformed values."""

from __future__ import annotations

import pytest

from engine.__main__ import main
from engine.config import EngineConfig
from engine.knobs import KnobError, read_knobs
from engine.levers import LeverError, Levers, env_name, lever_names

BAD_TEXT = ["4_0", "-1", "٣", "2.0", " 2", ""]


def test_environment_and_explicit_values_resolve_explicit_first():
    env = {
        "PEGAINFER_SPEC_HEDGE": "8",
        "PEGAINFER_SPEC_HEDGE_POSITIONS": "0,1,2",
        "PEGAINFER_SPEC_HEDGE_AUTO": "1",
        "PEGAINFER_SPEC_HEDGE_KNEE": "96",
    }
    lv = read_knobs(env).levers
    assert (lv.hedge, lv.hedge_positions, lv.hedge_auto, lv.hedge_knee) == (8, (0, 1, 2), True, 96)
    explicit = EngineConfig(model="x", levers={"hedge": 0, "hedge_positions": [3], "hedge_auto": False}).levers
    lv = lv.replace(explicit)
    assert (lv.hedge, lv.hedge_positions, lv.hedge_auto, lv.hedge_knee) == (0, (3,), False, 96)


def test_every_lever_has_an_environment_variable():
    assert [env_name(n) for n in lever_names()] == [
        "PEGAINFER_SPEC_MAX_BATCH",
        "PEGAINFER_SPEC_MAX_DRAFTS",
        "PEGAINFER_SPEC_HEDGE",
        "PEGAINFER_SPEC_HEDGE_POSITIONS",
        "PEGAINFER_SPEC_HEDGE_AUTO",
        "PEGAINFER_SPEC_HEDGE_KNEE",
        "PEGAINFER_SPEC_POLICY",
    ]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("max_batch", -1),
        ("max_drafts", 2.5),
        ("max_batch", True),
        ("max_drafts", "4"),
        ("hedge", 2**64),
        ("hedge_positions", (0, -1)),
        ("hedge_positions", "012"),
        ("hedge_positions", (True,)),
        ("hedge_auto", 1),
        ("hedge_knee", 2.5),
    ],
)
def test_bad_values_are_refused_by_every_explicit_source(name, value):
    with pytest.raises(LeverError, match=name):
        EngineConfig(model="x", levers={name: value})
    with pytest.raises(LeverError, match=name):
        Levers().replace({name: value})


def test_unknown_lever_names_are_refused():
    with pytest.raises(LeverError, match="max_batchh"):
        EngineConfig(model="x", levers={"max_batchh": 2})
    with pytest.raises(ValueError, match="mapping"):
        EngineConfig(model="x", levers=[("max_batch", 2)])


def test_a_levers_instance_is_taken_as_explicit_values():
    assert EngineConfig(model="x", levers=Levers(max_drafts=3)).levers["max_drafts"] == 3


@pytest.mark.parametrize("raw", BAD_TEXT)
@pytest.mark.parametrize("name", ["max_batch", "max_drafts", "hedge_positions"])
def test_cli_flags_refuse_what_the_environment_refuses(name, raw, capsys):
    with pytest.raises(KnobError):
        read_knobs({env_name(name): raw})
    flag = "--" + name.replace("_", "-")
    with pytest.raises(SystemExit) as err:
        main(["generate", "--prompt", "x", flag, raw])
    assert err.value.code == 2
    assert f"argument {flag}" in capsys.readouterr().err
