"""The levers gate's cases: which lossless child runs under which lever, and what its trace must show."""

from __future__ import annotations

import enum
from dataclasses import dataclass

CHILD_MODULE = "gates/test_lossless.py"
GREEDY = "test_greedy_matches_plain_greedy"
CONCURRENT = "test_concurrent_heterogeneous_is_lossless"
STOP = "test_stop_tokens_end_like_plain_decode"
# The known-continuation child (gates/known_child.py): the bench-only 4B-geometry pair (tiny shapes on
# CPU) with the modelled drafter, started as `python -m gates.known_child`, not as a pytest node.
KNOWN = "known_continuation"
KNOWN_MODULE = "gates.known_child"
KNOB_PREFIX = "PEGAINFER_SPEC_"  # every lever knob (MAX_BATCH, MAX_DRAFTS, HEDGE*): a case sets its own only
# A Markov-head (DSpark) drafter: the gate passes it to its hedge children only, whose weights then use
# it in place of the pair's drafter (gates/weights.py); every other child keeps the pair's drafter.
HEDGE_DRAFTER_ENV = "PEGAINFER_TEST_HEDGE_DRAFTER"
ADAPTIVE_TABLE = "gates/data/adaptive-loss.csv"  # relative to the repository root, the children's cwd


class Expect(enum.Enum):
    ALL_GATED = "every round gated"
    TRIM = "no gated round; some round verifies exactly k drafts, none more"
    RESUME = "gated rounds, then gated requests speculate and accept again"
    HEDGE = "hedge chains verified; at least one chain wins and at least one is discarded"
    HEDGE_GATED = "gated rounds verify no hedge chain; speculating rounds verify chains"
    STOP = "no gated round; some request ends on a stop token inside an accepted run"
    MIXED = "no gated round; drafts both accepted and rejected"

    @property
    def hedged(self) -> bool:
        return self in (Expect.HEDGE, Expect.HEDGE_GATED)


@dataclass(frozen=True)
class LeverCase:
    child: str  # lossless child test function in CHILD_MODULE
    short: str
    knob: str | None  # the variable without its PEGAINFER_SPEC_ prefix; None: the default levers
    value: int | str | None
    expect: Expect
    extra: tuple[tuple[str, str], ...] = ()  # more knobs of the same lever, e.g. (("HEDGE_POSITIONS", "0,1,2"),)

    @property
    def id(self) -> str:
        return f"{self.short}-{self.env_label.replace(' ', '-')}"

    @property
    def nodeid(self) -> str:
        return f"{CHILD_MODULE}::{self.child}"

    @property
    def known(self) -> bool:
        """Runs on the known-continuation pair: the outputs must be the known continuation, and the
        modelled drafter's drafts must be both accepted and rejected (else the check has no power)."""
        return self.child == KNOWN

    @property
    def _knobs(self) -> tuple[tuple[str, object], ...]:
        return ((self.knob, self.value), *self.extra) if self.knob else self.extra

    @property
    def env_label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self._knobs) or "default levers"

    @property
    def env(self) -> dict[str, str]:
        return {KNOB_PREFIX + k: str(v) for k, v in self._knobs}


# SPEC section 3, in its order (the run record keeps it), then the stop-token case.
CASES: tuple[LeverCase, ...] = (
    LeverCase(GREEDY, "greedy", "MAX_BATCH", 1, Expect.ALL_GATED),
    LeverCase(GREEDY, "greedy", "MAX_DRAFTS", 4, Expect.TRIM),
    LeverCase(CONCURRENT, "concurrent", "MAX_DRAFTS", 4, Expect.TRIM),
    LeverCase(GREEDY, "greedy", "MAX_DRAFTS", 2, Expect.TRIM),
    LeverCase(CONCURRENT, "concurrent", "MAX_DRAFTS", 2, Expect.TRIM),
    LeverCase(CONCURRENT, "concurrent", "MAX_BATCH", 3, Expect.RESUME),
    LeverCase(STOP, "stop", None, None, Expect.STOP),
    # The adaptive policy (SPEC 9) on a cost table where speculation loses at batch 4 and up: it gates
    # (K = 0) while the batch is 4, then speculates again; the trace cross-check holds every round
    # to its span_limit.
    LeverCase(CONCURRENT, "concurrent", "POLICY", "adaptive", Expect.RESUME, (("COST_TABLE", ADAPTIVE_TABLE),)),
)
# Hedged verify (SPEC 2.7) needs a Markov-head drafter: these cases run on one and skip with the
# reason when there is none. The second gates the batch: no chain may be verified in a gated round.
HEDGE_CASES: tuple[LeverCase, ...] = (
    LeverCase(GREEDY, "greedy", "HEDGE", 8, Expect.HEDGE, (("HEDGE_POSITIONS", "0,1,2"),)),
    LeverCase(
        CONCURRENT, "concurrent", "HEDGE", 8, Expect.HEDGE_GATED, (("HEDGE_POSITIONS", "0,1,2"), ("MAX_BATCH", "3"))
    ),
)
# The known-continuation pair (SPEC 9, bench-only): the real Qwen3-4B geometry on a CUDA device, the
# tiny shapes on CPU; the modelled `code` drafter; eight staggered requests at once (the batch shrinks).
KNOWN_CASES: tuple[LeverCase, ...] = (
    LeverCase(KNOWN, "known", None, None, Expect.MIXED),
    LeverCase(KNOWN, "known", "MAX_DRAFTS", 4, Expect.TRIM),
    LeverCase(KNOWN, "known", "MAX_BATCH", 3, Expect.RESUME),
    LeverCase(KNOWN, "known", "POLICY", "adaptive", Expect.RESUME, (("COST_TABLE", ADAPTIVE_TABLE),)),
)
ALL_CASES = CASES + HEDGE_CASES + KNOWN_CASES
