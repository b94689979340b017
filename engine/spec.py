"""The verify round's bookkeeping: span sizes, and what one request commits from its span."""

from __future__ import annotations

from dataclasses import dataclass

from engine.request import Request


def round_drafts(drafts_per_round: int, max_drafts: int) -> int:
    """k: drafts entering a speculative round's verify, uniform across the batch (span = 1 + k);
    max_drafts 0 = no trim. (A gated round verifies the current token alone: no drafts.)"""
    return min(drafts_per_round, max_drafts) if max_drafts else drafts_per_round


def draft_limit(k: int, remaining: int) -> int:
    """Drafts of a request that may be accepted: the budget left minus the bonus token, so a round
    never overshoots max_tokens."""
    return max(0, min(k, remaining - 1))


@dataclass(frozen=True)
class RoundOutcome:
    verified_draft: int
    accepted_draft: int
    committed: int


def settle(req: Request, drafts: list[int], targets: list[int], accepted: int, limit: int) -> RoundOutcome:
    """Commit d1..dn plus the target's token after dn (the bonus) for one request.

    drafts: d1..dk; targets: the target's token after each span row [current, d1..dk];
    accepted: n, the longest prefix (<= limit) with d_{i+1} == targets[i]. A stop token inside
    the run ends the request there; the rest is rolled back like a rejection. The KV advances
    by the committed rows [current, d1..dn]; the bonus is the next round's current token."""
    if not 0 <= accepted <= limit <= len(drafts):
        raise ValueError(f"{req.id}: accepted {accepted} outside [0, limit {limit}] of {len(drafts)} drafts")
    committed = req.commit([*drafts[:accepted], targets[accepted]])
    if not req.finished:
        req.num_kv += accepted + 1
    return RoundOutcome(verified_draft=limit, accepted_draft=accepted, committed=committed)
