"""Which target + drafter pair the gates run on."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from engine.fixture.paths import shipped_pair

TARGET_ENV = "PEGAINFER_TEST_MODEL_PATH"
DRAFTER_ENV = "PEGAINFER_DFLASH_TEST_MODEL_PATH"


@dataclass(frozen=True)
class GateWeights:
    target: str
    drafter: str
    label: str


def resolve_gate_weights() -> tuple[GateWeights | None, str]:
    """The pair named by the environment, else the shipped tiny fixture pair.

    Returns (weights, "") or (None, reason-to-skip)."""
    target, drafter = os.environ.get(TARGET_ENV), os.environ.get(DRAFTER_ENV)
    if bool(target) != bool(drafter):
        missing = DRAFTER_ENV if target else TARGET_ENV
        return None, f"{missing} is unset while the other weight variable is set; set both or neither"
    if target and drafter:
        for var, value in ((TARGET_ENV, target), (DRAFTER_ENV, drafter)):
            if not Path(value).expanduser().is_dir() and value.count("/") != 1:
                return None, f"{var}={value!r} is neither a directory nor a hub repo id"
        return GateWeights(target, drafter, f"{target} + {drafter}"), ""
    t, d = shipped_pair("tiny")
    if not (t / "config.json").is_file() or not (d / "config.json").is_file():
        return None, f"the shipped tiny fixture pair is missing under {t.parent}"
    return GateWeights(str(t), str(d), "fixture:tiny"), ""
