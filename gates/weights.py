"""Which target + drafter pair the gates run on."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.knobs import read_gate_knobs
from engine.shipped import shipped_dspark, shipped_pair
from gates.cases import HEDGE_DRAFTER_ENV

TARGET_ENV = "PEGAINFER_TEST_MODEL_PATH"
DRAFTER_ENV = "PEGAINFER_DFLASH_TEST_MODEL_PATH"


@dataclass(frozen=True)
class GateWeights:
    target: str
    drafter: str
    label: str


def resolve_gate_weights() -> tuple[GateWeights | None, str]:
    """The pair named by the environment, else the shipped tiny fixture pair; with
    PEGAINFER_TEST_HEDGE_DRAFTER set, that drafter replaces the pair's (the label, which picks the
    prompts, stays the target's).

    Returns (weights, "") or (None, reason-to-skip)."""
    weights, reason = _resolve_pair()
    hedge = read_gate_knobs().hedge_drafter
    if weights is None or not hedge:
        return weights, reason
    if not _is_checkpoint(hedge):
        return None, f"{HEDGE_DRAFTER_ENV}={hedge!r} is neither a directory nor a hub repo id"
    return GateWeights(weights.target, hedge, weights.label), ""


def _is_checkpoint(value: str) -> bool:
    return Path(value).expanduser().is_dir() or value.count("/") == 1


def hedge_drafter(weights: GateWeights) -> tuple[str | None, str]:
    """The Markov-head drafter the hedge case runs: PEGAINFER_TEST_HEDGE_DRAFTER, else the fixture's
    drafter-dspark on the fixture pair. Returns (path, "") or (None, reason-to-skip)."""
    from engine.loader import CheckpointError, open_checkpoint
    from engine.models.config import DFlashConfig

    chosen = read_gate_knobs().hedge_drafter
    if not chosen:
        if weights.label != "fixture:tiny":
            return None, (
                f"no Markov-head drafter for {weights.label}: set {HEDGE_DRAFTER_ENV} to a DSpark "
                "drafter that fits the target"
            )
        chosen = str(shipped_dspark("tiny"))
        if not (Path(chosen) / "config.json").is_file():
            return (
                None,
                f"the fixture's Markov-head drafter is missing ({chosen}); build it with "
                "`python -m engine.fixture markov`",
            )
    if not _is_checkpoint(chosen):
        return None, f"{HEDGE_DRAFTER_ENV}={chosen!r} is neither a directory nor a hub repo id"
    try:
        cfg = DFlashConfig.from_dict(open_checkpoint(chosen).config, where=chosen)
    except (CheckpointError, OSError) as err:
        return None, f"hedge drafter {chosen!r} is not a readable drafter: {err}"
    if cfg.markov_rank <= 0:
        return None, f"hedge drafter {chosen!r} has no Markov head (markov_rank 0): hedging needs DSpark"
    return chosen, ""


def hedge_label(drafter: str) -> str:
    """How the run record names the hedge drafter: the fixture's by name, others by path."""
    shipped = shipped_dspark("tiny")
    return "fixture:tiny/drafter-dspark" if Path(drafter).resolve() == shipped.resolve() else drafter


def _resolve_pair() -> tuple[GateWeights | None, str]:
    knobs = read_gate_knobs()
    target, drafter = knobs.target, knobs.drafter
    if bool(target) != bool(drafter):
        missing = DRAFTER_ENV if target else TARGET_ENV
        return None, f"{missing} is unset while the other weight variable is set; set both or neither"
    if target and drafter:
        for var, value in ((TARGET_ENV, target), (DRAFTER_ENV, drafter)):
            if not _is_checkpoint(value):
                return None, f"{var}={value!r} is neither a directory nor a hub repo id"
        return GateWeights(target, drafter, f"{target} + {drafter}"), ""
    t, d = shipped_pair("tiny")
    if not (t / "config.json").is_file() or not (d / "config.json").is_file():
        return None, f"the shipped tiny fixture pair is missing under {t.parent}"
    return GateWeights(str(t), str(d), "fixture:tiny"), ""
