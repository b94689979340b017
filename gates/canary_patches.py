"""The canaries' patches (the table: gates/canaries.py): each gets its targets' originals ("module:attribute"
-> object) and returns their replacements, planted in a child process by gates/plant.py."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

WRONG_AT = 70  # the output position the wrong-token canary corrupts: past the first 64 tokens


def gated_forget_capture(orig: dict[str, Any]) -> dict[str, Any]:
    """A gated round commits its token like a plain decode: the drafter context is dropped."""
    one_token: set[int] = set()  # requests whose latest target forward was a one-token step
    decode, verify, advanced = (orig[t] for t in GATED_TARGETS)

    def decode_(self, reqs, *a, **k):
        one_token.update(id(r) for r in reqs)
        return decode(self, reqs, *a, **k)

    def verify_(self, reqs, *a, **k):
        one_token.difference_update(id(r) for r in reqs)
        return verify(self, reqs, *a, **k)

    def advanced_(self, accepted, bonus, keep_context):
        return advanced(self, accepted, bonus, keep_context and id(self) not in one_token)

    return dict(zip(GATED_TARGETS, (decode_, verify_, advanced_), strict=True))


GATED_TARGETS = (
    "engine.runner:ModelRunner.decode",
    "engine.runner:ModelRunner.verify",
    "engine.request:Request.advanced",
)


def gated_rows_unstored(orig: dict[str, Any]) -> dict[str, Any]:
    """A one-token (gated) step's forward skips storing its feature rows; the bookkeeping says stored."""
    decode = orig["engine.runner:ModelRunner.decode"]

    def decode_(self, reqs, *a, **k):
        self.drafter.store_context = lambda *_a, **_k: None  # the instance's, for this step only
        try:
            return decode(self, reqs, *a, **k)
        finally:
            del self.drafter.store_context

    return {"engine.runner:ModelRunner.decode": decode_}


def trim_leak(orig: dict[str, Any]) -> dict[str, Any]:
    """MAX_DRAFTS=k lets k + 1 drafts into the verify."""

    def round_drafts(drafts_per_round: int, max_drafts: int) -> int:
        return min(drafts_per_round, max_drafts + 1) if max_drafts else drafts_per_round

    return {"engine.policy.choice:round_drafts": round_drafts}


def budget_overrun(orig: dict[str, Any]) -> dict[str, Any]:
    """The accept limit forgets the bonus token: a round may accept its whole remaining budget."""

    def draft_limit(k: int, remaining):  # on host budgets, and on the device's for a round launched ahead
        return remaining.clamp(0, k) if hasattr(remaining, "clamp") else max(0, min(k, remaining))

    return dict.fromkeys(orig, draft_limit)


def stops_at_round_end(field: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
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


def wrong_token(orig: dict[str, Any]) -> dict[str, Any]:
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


def trace_filter(rewrite: Callable[[str], str | None]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def patch(orig: dict[str, Any]) -> dict[str, Any]:
        orig["engine.trace:TRACE"].addFilter(_RoundLines(rewrite))
        return {}  # the logger itself stays; its filter does the lying

    return patch


def flip_gated(text: str) -> str:
    return text.replace("gated=1", "gated=_").replace("gated=0", "gated=1").replace("gated=_", "gated=0")


def policy_over_cap(orig: dict[str, Any]) -> dict[str, Any]:
    """The adaptive policy plans its K without MAX_DRAFTS' cap."""
    plan = orig["engine.policy.span:SpanPolicy.plan"]
    return {"engine.policy.span:SpanPolicy.plan": lambda self, batch, _cap=0, *a, **k: plan(self, batch, 0, *a, **k)}


def budget_over_cap(orig: dict[str, Any]) -> dict[str, Any]:
    """The per-request chooser caps each K_i by the budget and the drafter, not by MAX_DRAFTS."""
    caps = orig["engine.policy.choice:request_caps"]
    return {"engine.policy.choice:request_caps": lambda remaining, per_round, _cap: caps(remaining, per_round, 0)}


def penalty_ignores_drafts(orig: dict[str, Any]) -> dict[str, Any]:
    """A verify row's penalties count the committed output only, not the drafts before it in the round."""
    sample = orig["engine.round:sample_requests"]

    def sample_(logits, greedy, reqs, rows_each, drafts=None):
        return sample(logits, greedy, reqs, rows_each)

    return {"engine.round:sample_requests": sample_}


def abort_ignored(orig: dict[str, Any]) -> dict[str, Any]:
    """The server never aborts a request whose client went away: its KV stays held."""
    return {"engine.serve.worker:EngineWorker.abort": lambda self, *a, **k: None}


def ahead_wrong_anchor(orig: dict[str, Any]) -> dict[str, Any]:
    """A speculative round launched ahead is staged on the wrong anchor (its bonus token + 1)."""
    ((target, advance),) = orig.items()

    def advance_round(self, reqs, *args):
        advance(self, reqs, *args)
        self.field("token", len(reqs)).add_(1)

    return {target: advance_round}
