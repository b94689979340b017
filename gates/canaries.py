"""Canaries: the gate proves it can fail. Each plants one known bug in one child process (a test-side
patch; no switch in the engine), runs a lever case's child on it, and expects that child's verdict to
FAIL naming the invariant the bug breaks (gates/test_canaries.py). A canary whose child passes, or
fails for another reason, fails the gate run: the gate cannot see that bug.

The whole table lives here: name -> the bug, the case it runs on, the phrase the verdict must hold, and
the patch with its targets ("module:attribute"; tests/test_gate_canaries.py resolves each, so this file
is the one place to retarget), planted in a child process by gates/plant.py. Patch points are the stable
modules where they can be (engine.request, engine.runner, engine.trace's logger), else where the rule
lives (engine.policy.choice, engine.policy.span, engine.round, engine.serve.worker).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gates.cases import ALL_CASES, RAGGED_CASES, LeverCase

ENV = "PEGAINFER_TEST_CANARY"  # set in the planted child, so a child that starts a server plants it there too
WRONG_AT = 70  # the output position the wrong-token canary corrupts: past the first 64 tokens


@dataclass(frozen=True)
class Canary:
    name: str
    bug: str  # what is planted; "the gate cannot see <bug>" when the canary passes
    case: LeverCase  # the case whose child runs with the bug
    expect: str  # a phrase some problem of the verdict must hold: the invariant named
    targets: tuple[str, ...]  # "module:attr.path" the patch replaces
    patch: Callable[[dict[str, Any]], dict[str, Any]]  # the targets' originals -> their replacements


# -- the patches: each gets the targets' originals and returns their replacements ---------------------


def _gated_forget_capture(orig: dict[str, Any]) -> dict[str, Any]:
    """A gated round commits its token like a plain decode: the drafter context is dropped."""
    one_token: set[int] = set()  # requests whose latest target forward was a one-token step
    decode, verify, advanced = (orig[t] for t in _GATED_TARGETS)

    def decode_(self, reqs, *a, **k):
        one_token.update(id(r) for r in reqs)
        return decode(self, reqs, *a, **k)

    def verify_(self, reqs, *a, **k):
        one_token.difference_update(id(r) for r in reqs)
        return verify(self, reqs, *a, **k)

    def advanced_(self, accepted, bonus, keep_context):
        return advanced(self, accepted, bonus, keep_context and id(self) not in one_token)

    return dict(zip(_GATED_TARGETS, (decode_, verify_, advanced_), strict=True))


_GATED_TARGETS = (
    "engine.runner:ModelRunner.decode",
    "engine.runner:ModelRunner.verify",
    "engine.request:Request.advanced",
)


def _gated_rows_unstored(orig: dict[str, Any]) -> dict[str, Any]:
    """A one-token (gated) step's forward skips storing its feature rows; the bookkeeping says stored."""
    decode = orig["engine.runner:ModelRunner.decode"]

    def decode_(self, reqs, *a, **k):
        self.drafter.store_context = lambda *_a, **_k: None  # the instance's, for this step only
        try:
            return decode(self, reqs, *a, **k)
        finally:
            del self.drafter.store_context

    return {"engine.runner:ModelRunner.decode": decode_}


def _trim_leak(orig: dict[str, Any]) -> dict[str, Any]:
    """MAX_DRAFTS=k lets k + 1 drafts into the verify."""

    def round_drafts(drafts_per_round: int, max_drafts: int) -> int:
        return min(drafts_per_round, max_drafts + 1) if max_drafts else drafts_per_round

    return {"engine.policy.choice:round_drafts": round_drafts}


def _budget_overrun(orig: dict[str, Any]) -> dict[str, Any]:
    """The accept limit forgets the bonus token: a round may accept its whole remaining budget."""

    def draft_limit(k: int, remaining):  # on host budgets, and on the device's for a round launched ahead
        return remaining.clamp(0, k) if hasattr(remaining, "clamp") else max(0, min(k, remaining))

    return dict.fromkeys(orig, draft_limit)


def _stops_at_round_end(field: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A stop token (field stop_ids) or stop string (stop_strings) is honoured only on a round's last
    committed token: one inside an accepted run lets the run go on."""

    def patch(orig: dict[str, Any]) -> dict[str, Any]:
        commit = orig["engine.request:Request._commit"]
        off = frozenset() if field == "stop_ids" else None

        def commit_(self, tokens):
            if len(tokens) < 2 or getattr(self, field) is None:
                return commit(self, tokens)
            kept = getattr(self, field)
            setattr(self, field, off)
            try:
                n = commit(self, tokens[:-1])
            finally:
                setattr(self, field, kept)
            return n if self.finished else n + commit(self, tokens[-1:])

        return {"engine.request:Request._commit": commit_}

    return patch


def _wrong_token(orig: dict[str, Any]) -> dict[str, Any]:
    """The speculative path commits a wrong token at output position WRONG_AT (plain decode keeps
    no drafter context, so it stays right)."""
    advanced = orig["engine.request:Request.advanced"]

    def advanced_(self, accepted, bonus, keep_context):
        tokens, start = [*accepted, bonus], len(self.output_ids)
        if keep_context and start <= WRONG_AT < start + len(tokens):
            tokens[WRONG_AT - start] ^= 1
        return advanced(self, tokens[:-1], tokens[-1], keep_context)

    return {"engine.request:Request.advanced": advanced_}


class _RoundLines(logging.Filter):
    """Rewrites (or drops, when `rewrite` returns None) each `DFlash round` trace line."""

    def __init__(self, rewrite: Callable[[str], str | None]):
        super().__init__()
        self.rewrite = rewrite

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if not text.startswith("DFlash round"):
            return True
        new = self.rewrite(text)
        record.msg, record.args = new, ()
        return new is not None


def _trace_filter(rewrite: Callable[[str], str | None]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def patch(orig: dict[str, Any]) -> dict[str, Any]:
        orig["engine.trace:TRACE"].addFilter(_RoundLines(rewrite))
        return {}  # the logger itself stays; its filter does the lying

    return patch


def _flip_gated(text: str) -> str:
    return text.replace("gated=1", "gated=_").replace("gated=0", "gated=1").replace("gated=_", "gated=0")


def _policy_over_cap(orig: dict[str, Any]) -> dict[str, Any]:
    """The adaptive policy plans its K without MAX_DRAFTS' cap."""
    plan = orig["engine.policy.span:SpanPolicy.plan"]
    return {"engine.policy.span:SpanPolicy.plan": lambda self, batch, _cap=0, *a, **k: plan(self, batch, 0, *a, **k)}


def _budget_over_cap(orig: dict[str, Any]) -> dict[str, Any]:
    """The per-request chooser caps each K_i by the budget and the drafter, not by MAX_DRAFTS."""
    caps = orig["engine.policy.choice:request_caps"]
    return {"engine.policy.choice:request_caps": lambda remaining, per_round, _cap: caps(remaining, per_round, 0)}


def _penalty_ignores_drafts(orig: dict[str, Any]) -> dict[str, Any]:
    """A verify row's penalties count the committed output only, not the drafts before it in the round."""
    sample = orig["engine.round:sample_requests"]

    def sample_(logits, greedy, reqs, rows_each, drafts=None):
        return sample(logits, greedy, reqs, rows_each)

    return {"engine.round:sample_requests": sample_}


def _abort_ignored(orig: dict[str, Any]) -> dict[str, Any]:
    """The server never aborts a request whose client went away: its KV stays held."""
    return {"engine.serve.worker:EngineWorker.abort": lambda self, *a, **k: None}


_CASE = {c.id: c for c in ALL_CASES}
CANARIES: dict[str, Canary] = {
    c.name: c
    for c in (
        Canary(
            "gated-capture-lost",
            "a gated round that drops the drafter context",
            _CASE["known-MAX_BATCH=3"],
            "the capture is lost",
            _GATED_TARGETS,
            _gated_forget_capture,
        ),
        Canary(
            "gated-row-unstored",
            "a gated round that does not store its context row (the count still says stored)",
            _CASE["capture-invariant-default-levers"],
            "capture content",
            ("engine.runner:ModelRunner.decode",),
            _gated_rows_unstored,
        ),
        Canary(
            "trim-leak",
            "the trim letting one draft more into the verify",
            _CASE["known-MAX_DRAFTS=4"],
            "the trim leaks",
            ("engine.policy.choice:round_drafts",),
            _trim_leak,
        ),
        Canary(
            "stop-token-overrun",
            "a stop token inside an accepted run that does not end the request",
            _CASE["stop-default-levers"],
            "is the stop token",
            ("engine.request:Request._commit",),
            _stops_at_round_end("stop_ids"),
        ),
        Canary(
            "stop-string-overrun",
            "a stop string completed inside an accepted run that does not end the request",
            _CASE["stop-strings-default-levers"],
            "completes the stop string",
            ("engine.request:Request._commit",),
            _stops_at_round_end("stop_strings"),
        ),
        Canary(
            "wrong-token-past-64",
            f"a wrong token at output position {WRONG_AT}",
            _CASE["known-default-levers"],
            f"the lossless check failed: req-0 output token {WRONG_AT}:",
            ("engine.request:Request.advanced",),
            _wrong_token,
        ),
        Canary(
            "gated-flag-lies",
            "a trace whose gated= flag says the opposite of the plan",
            _CASE["known-MAX_BATCH=3"],
            "a gated round verifies none",
            ("engine.trace:TRACE",),
            _trace_filter(_flip_gated),
        ),
        Canary(
            "budget-overrun",
            "an accept limit that ignores the bonus token (a round overruns the budget)",
            _CASE["known-default-levers"],
            "the accept limit ignores the remaining budget",
            ("engine.round:draft_limit", "engine.staging:draft_limit"),
            _budget_overrun,
        ),
        Canary(
            "trace-silent",
            "a child that prints no round lines",
            _CASE["known-default-levers"],
            "printed no DFlash round lines",
            ("engine.trace:TRACE",),
            _trace_filter(lambda _text: None),
        ),
        Canary(
            "policy-over-cap",
            "an adaptive policy whose K ignores MAX_DRAFTS",
            _CASE["known-POLICY=adaptive-COST_TABLE=gates/data/adaptive-loss.csv-MAX_DRAFTS=4"],
            "above MAX_DRAFTS=4",
            ("engine.policy.span:SpanPolicy.plan",),
            _policy_over_cap,
        ),
        Canary(
            "budget-over-cap",
            "a per-request chooser whose K_i ignore MAX_DRAFTS",
            _CASE[RAGGED_CASES[0].id],
            "above MAX_DRAFTS=4",
            ("engine.policy.choice:request_caps",),
            _budget_over_cap,
        ),
        Canary(
            "penalty-ignores-drafts",
            "a verify row penalized on the committed output alone, not the round's drafts before it",
            _CASE["penalties-MAX_DRAFTS=4"],
            "the target picks",
            ("engine.round:sample_requests",),
            _penalty_ignores_drafts,
        ),
        Canary(
            "abort-ignored",
            "a server that does not abort a request whose client went away",
            _CASE["serve-default-levers"],
            "KV blocks",
            ("engine.serve.worker:EngineWorker.abort",),
            _abort_ignored,
        ),
    )
}
