"""Canaries: the gate proves it can fail. Each plants one known bug in one child process (a test-side
patch; no switch in the engine), runs a lever case's child on it, and expects that child's verdict to
FAIL naming the invariant the bug breaks (gates/test_canaries.py). A canary whose child passes, or
fails for another reason, fails the gate run: the gate cannot see that bug.

The whole table lives here: name -> the bug, the case it runs on, the phrase the verdict must hold, and
the patch (gates/canary_patches.py) with its targets ("module:attribute"; tests/test_gate_canaries.py
resolves each, so this file is the one place to retarget), planted in a child process by gates/plant.py.
Patch points are the stable modules where they can be (engine.request, engine.runner, engine.trace's
logger), else where the rule lives (engine.policy.choice, engine.policy.span, engine.round,
engine.staging, engine.serve.worker).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gates import canary_patches as patches
from gates.canary_patches import WRONG_AT
from gates.cases import ALL_CASES, RAGGED_CASES, LeverCase

ENV = "PEGAINFER_TEST_CANARY"  # set in the planted child, so a child that starts a server plants it there too


@dataclass(frozen=True)
class Canary:
    name: str
    bug: str  # what is planted; "the gate cannot see <bug>" when the canary passes
    case: LeverCase  # the case whose child runs with the bug
    expect: str  # a phrase some problem of the verdict must hold: the invariant named
    targets: tuple[str, ...]  # "module:attr.path" the patch replaces
    patch: Callable[[dict[str, Any]], dict[str, Any]]  # the targets' originals -> their replacements


_CASE = {c.id: c for c in ALL_CASES}
CANARIES: dict[str, Canary] = {
    c.name: c
    for c in (
        Canary(
            "gated-capture-lost",
            "a gated round that drops the drafter context",
            _CASE["known-MAX_BATCH=3"],
            "the capture is lost",
            patches.GATED_TARGETS,
            patches.gated_forget_capture,
        ),
        Canary(
            "gated-row-unstored",
            "a gated round that does not store its context row (the count still says stored)",
            _CASE["capture-invariant-default-levers"],
            "capture content",
            ("engine.runner:ModelRunner.decode",),
            patches.gated_rows_unstored,
        ),
        Canary(
            "trim-leak",
            "the trim letting one draft more into the verify",
            _CASE["known-MAX_DRAFTS=4"],
            "the trim leaks",
            ("engine.policy.choice:round_drafts",),
            patches.trim_leak,
        ),
        Canary(
            "stop-token-overrun",
            "a stop token inside an accepted run that does not end the request",
            _CASE["stop-default-levers"],
            "is the stop token",
            ("engine.request:Request._commit",),
            patches.stops_at_round_end("stop_ids"),
        ),
        Canary(
            "stop-string-overrun",
            "a stop string completed inside an accepted run that does not end the request",
            _CASE["stop-strings-default-levers"],
            "completes the stop string",
            ("engine.request:Request._commit",),
            patches.stops_at_round_end("stop_strings"),
        ),
        Canary(
            "wrong-token-past-64",
            f"a wrong token at output position {WRONG_AT}",
            _CASE["known-default-levers"],
            f"the lossless check failed: req-0 output token {WRONG_AT}:",
            ("engine.request:Request.advanced",),
            patches.wrong_token,
        ),
        Canary(
            "gated-flag-lies",
            "a trace whose gated= flag says the opposite of the plan",
            _CASE["known-MAX_BATCH=3"],
            "a gated round verifies none",
            ("engine.trace:TRACE",),
            patches.trace_filter(patches.flip_gated),
        ),
        Canary(
            "budget-overrun",
            "an accept limit that ignores the bonus token (a round overruns the budget)",
            _CASE["known-default-levers"],
            "the accept limit ignores the remaining budget",
            ("engine.round:draft_limit", "engine.staging:draft_limit"),
            patches.budget_overrun,
        ),
        Canary(
            "trace-silent",
            "a child that prints no round lines",
            _CASE["known-default-levers"],
            "printed no DFlash round lines",
            ("engine.trace:TRACE",),
            patches.trace_filter(lambda _text: None),
        ),
        Canary(
            "policy-over-cap",
            "an adaptive policy whose K ignores MAX_DRAFTS",
            _CASE["known-POLICY=adaptive-COST_TABLE=gates/data/adaptive-loss.csv-MAX_DRAFTS=4"],
            "above MAX_DRAFTS=4",
            ("engine.policy.span:SpanPolicy.plan",),
            patches.policy_over_cap,
        ),
        Canary(
            "budget-over-cap",
            "a per-request chooser whose K_i ignore MAX_DRAFTS",
            _CASE[RAGGED_CASES[0].id],
            "above MAX_DRAFTS=4",
            ("engine.policy.choice:request_caps",),
            patches.budget_over_cap,
        ),
        Canary(
            "penalty-ignores-drafts",
            "a verify row penalized on the committed output alone, not the round's drafts before it",
            _CASE["penalties-MAX_DRAFTS=4"],
            "the target picks",
            ("engine.round:sample_requests",),
            patches.penalty_ignores_drafts,
        ),
        Canary(
            "ahead-wrong-anchor",
            "a speculative round launched ahead staged on the wrong anchor",
            _CASE["known-default-levers"],
            "the lossless check failed",
            ("engine.staging:StagedInputs.advance_round",),
            patches.ahead_wrong_anchor,
        ),
        Canary(
            "abort-ignored",
            "a server that does not abort a request whose client went away",
            _CASE["serve-default-levers"],
            "KV blocks",
            ("engine.serve.worker:EngineWorker.abort",),
            patches.abort_ignored,
        ),
    )
}
