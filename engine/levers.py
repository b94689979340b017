"""The load levers of the speculative path, resolved from EngineConfig and the environment."""

from __future__ import annotations

from dataclasses import dataclass

from engine.config import EngineConfig
from engine.knobs import Knobs


@dataclass(frozen=True)
class Levers:
    max_batch: int
    max_drafts: int
    trace: bool
    hedge: int = 0  # hedged requests per round (0 = off)
    hedge_positions: tuple[int, ...] = ()  # branch positions; () = (0,)
    hedge_auto: bool = False
    hedge_knee: int = 0  # verify rows the chains never push the round past (0 = no knee)


def resolve_levers(config: EngineConfig, knobs: Knobs) -> Levers:
    """Explicit config values win over the environment; None means "take the environment"."""

    def pick(explicit, from_env):
        return from_env if explicit is None else explicit

    spec = knobs.spec
    return Levers(
        max_batch=pick(config.spec_max_batch, spec.max_batch),
        max_drafts=pick(config.spec_max_drafts, spec.max_drafts),
        trace=pick(config.trace, knobs.test_log),
        hedge=pick(config.spec_hedge, spec.hedge),
        hedge_positions=tuple(pick(config.spec_hedge_positions, spec.hedge_positions)),
        hedge_auto=bool(pick(config.spec_hedge_auto, spec.hedge_auto)),
        hedge_knee=pick(config.spec_hedge_knee, spec.hedge_knee),
    )


def check_lever_values(**values) -> None:
    """set_levers' arguments: counts >= 0 (None = keep), positions a sequence of counts, auto a bool."""
    for name, value in values.items():
        if value is None:
            continue
        if name == "hedge_positions":
            if isinstance(value, (str, bytes)) or not all(
                isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in value
            ):
                raise ValueError(f"hedge_positions={value!r}; expected a sequence of ints >= 0")
        elif name == "hedge_auto":
            if not isinstance(value, bool):
                raise ValueError(f"hedge_auto={value!r}; expected a bool")
        elif isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name}={value!r}; expected an int >= 0 (0 = off)")
