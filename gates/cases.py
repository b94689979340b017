"""The levers gate's cases: which lossless child runs under which lever, and what its trace must show."""

from __future__ import annotations

import enum
from dataclasses import dataclass

CHILD_MODULE = "gates/test_lossless.py"
GREEDY = "test_greedy_matches_plain_greedy"
CONCURRENT = "test_concurrent_heterogeneous_is_lossless"
STOP = "test_stop_tokens_end_like_plain_decode"
STOP_STRINGS = "test_stop_strings_end_like_plain_decode"
ARRIVALS = "test_arrivals_mid_run_are_lossless"
PENALTIES = "test_penalties_and_min_p_are_lossless"
# Children started as `python -m <module>`, not as pytest nodes: the known-continuation child (the
# bench-only 4B-geometry pair, tiny shapes on CPU, with the modelled drafter), the capture-content
# child and the server child (the lossless check through `pegaspec serve`).
KNOWN = "known_continuation"
CAPTURE = "capture_content"
SERVE = "served_lossless"
MODULES = {KNOWN: "gates.known_child", CAPTURE: "gates.capture_child", SERVE: "gates.serve_child"}
KNOB_PREFIX = "PEGAINFER_SPEC_"  # every lever knob (MAX_BATCH, MAX_DRAFTS, HEDGE*): a case sets its own only
# A Markov-head (DSpark) drafter: the gate passes it to its hedge children only, whose weights then use
# it in place of the pair's drafter (gates/weights.py); every other child keeps the pair's drafter.
HEDGE_DRAFTER_ENV = "PEGAINFER_TEST_HEDGE_DRAFTER"
ADAPTIVE_TABLE = "gates/data/adaptive-loss.csv"  # relative to the repository root, the children's cwd
BUDGET_TABLE = "gates/data/budget-mixed.csv"  # every draft slot costs 1 ms of verify: weak drafts do not pay


class Expect(enum.Enum):
    ALL_GATED = "every round gated"
    TRIM = "no gated round; some round verifies exactly k drafts, none more"
    RESUME = "gated rounds, then gated requests speculate and accept again"
    HEDGE = "hedge chains verified; at least one chain wins and at least one is discarded"
    HEDGE_GATED = "gated rounds verify no hedge chain; speculating rounds verify chains"
    STOP = "no gated round; some request ends on a stop token or string inside an accepted run"
    MIXED = "no gated round; drafts both accepted and rejected"
    CAPPED = "gated and speculating rounds; no round's K above MAX_DRAFTS, and some round at it"
    CAPTURE = "gated rounds store the ungated run's context rows; acceptance after the resume matches it"
    SERVE = "through the server: speculating rounds, lossless streams, a client gone early frees its KV"
    RAGGED = "K_i per request: some round mixes K, none above MAX_DRAFTS; gated requests resume and accept"
    HEDGE_BUDGET = "policy=budget with hedging: chains verified, no K_i above MAX_DRAFTS, none past its limit"

    @property
    def hedged(self) -> bool:
        return self in (Expect.HEDGE, Expect.HEDGE_GATED, Expect.HEDGE_BUDGET)


@dataclass(frozen=True)
class LeverCase:
    child: str  # lossless child test function in CHILD_MODULE
    short: str
    knob: str | None  # the variable without its PEGAINFER_SPEC_ prefix; None: the default levers
    value: int | str | None
    expect: Expect
    extra: tuple[tuple[str, str], ...] = ()  # more knobs of the same lever, e.g. (("HEDGE_POSITIONS", "0,1,2"),)
    args: tuple[str, ...] = ()  # a module child's command-line arguments

    @property
    def id(self) -> str:
        return f"{self.short}-{self._knob_label.replace(' ', '-')}"

    @property
    def nodeid(self) -> str:
        return f"{CHILD_MODULE}::{self.child}"

    @property
    def module(self) -> str | None:
        """The module a `python -m` child runs; None for a pytest child of CHILD_MODULE."""
        return MODULES.get(self.child)

    def knob_value(self, name: str) -> str | None:
        """The value this case sets for knob `name` (without its prefix), else None."""
        return next((str(v) for k, v in self._knobs if k == name), None)

    @property
    def known(self) -> bool:
        """Runs on the known-continuation pair: the outputs must be the known continuation, and the
        modelled drafter's drafts must be both accepted and rejected (else the check has no power)."""
        return self.child == KNOWN

    @property
    def _knobs(self) -> tuple[tuple[str, object], ...]:
        return ((self.knob, self.value), *self.extra) if self.knob else self.extra

    @property
    def _knob_label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self._knobs) or "default levers"

    @property
    def env_label(self) -> str:
        """The knobs (and a module child's arguments) as the gate line and the run record show them."""
        return " ".join((self._knob_label, *self.args))

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
# The combinations (issue 48): the adaptive policy capped by MAX_DRAFTS, on the known pair (on the loss
# table it gates at batch 4 and wants every draft below); stop strings completed inside accepted runs;
# the server.
COMBO_CASES: tuple[LeverCase, ...] = (
    LeverCase(
        KNOWN,
        "known",
        "POLICY",
        "adaptive",
        Expect.CAPPED,
        (("COST_TABLE", ADAPTIVE_TABLE), ("MAX_DRAFTS", 4)),
    ),
    LeverCase(STOP_STRINGS, "stop-strings", None, None, Expect.STOP),
    LeverCase(SERVE, "serve", None, None, Expect.SERVE),
)
# vLLM's penalties and min_p (issue 49) under the trim and under the gate: a verify row's penalties
# count the drafts before it in the round, a gated round's the committed output.
PENALTY_CASES: tuple[LeverCase, ...] = (
    LeverCase(PENALTIES, "penalties", "MAX_DRAFTS", 4, Expect.TRIM),
    LeverCase(PENALTIES, "penalties", "MAX_BATCH", 3, Expect.RESUME),
)
# Capture content (SPEC 10): the gate lever set mid-run, its drafter context and acceptance after the
# resume against an ungated run, under batch-invariant and under default numerics.
CAPTURE_CASES: tuple[LeverCase, ...] = tuple(
    LeverCase(CAPTURE, f"capture-{n}", None, None, Expect.CAPTURE, args=(f"--numerics={n}",))
    for n in ("invariant", "default")
)
# Hedged verify (SPEC 2.7) needs a Markov-head drafter: these cases run on one and skip with the
# reason when there is none. The second gates the batch: no chain may be verified in a gated round; the
# third does so with the auto-hedge controller choosing the chains, the gate arriving mid-run.
HEDGE_CASES: tuple[LeverCase, ...] = (
    LeverCase(GREEDY, "greedy", "HEDGE", 8, Expect.HEDGE, (("HEDGE_POSITIONS", "0,1,2"),)),
    LeverCase(
        CONCURRENT, "concurrent", "HEDGE", 8, Expect.HEDGE_GATED, (("HEDGE_POSITIONS", "0,1,2"), ("MAX_BATCH", "3"))
    ),
    LeverCase(
        ARRIVALS,
        "arrivals",
        "HEDGE",
        8,
        Expect.HEDGE_GATED,
        (("HEDGE_POSITIONS", "0,1,2"), ("HEDGE_AUTO", "1"), ("MAX_BATCH", "3")),
    ),
    # Hedged rounds under policy=budget (SPEC 10): every request verifies max K_i with its own limit.
    LeverCase(
        CONCURRENT,
        "concurrent",
        "HEDGE",
        8,
        Expect.HEDGE_BUDGET,
        (("HEDGE_POSITIONS", "0,1,2"), ("POLICY", "budget"), ("COST_TABLE", BUDGET_TABLE), ("MAX_DRAFTS", "4")),
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
# Spans per request (SPEC 10, policy=budget): the known pair with two acceptance classes (request i
# draws from `code` or `weak` by its parity), under the trim and the gate: the gated rounds up to token
# 56, then req-0 (code) and req-7 (weak) speculate with their own K_i, verified in one ragged forward.
RAGGED_CASES: tuple[LeverCase, ...] = (
    LeverCase(
        KNOWN,
        "known-mixed",
        "POLICY",
        "budget",
        Expect.RAGGED,
        (("COST_TABLE", BUDGET_TABLE), ("MAX_DRAFTS", 4), ("MAX_BATCH", 3)),
        ("--profile=code+weak",),
    ),
)
ALL_CASES = CASES + COMBO_CASES + PENALTY_CASES + CAPTURE_CASES + HEDGE_CASES + KNOWN_CASES + RAGGED_CASES
