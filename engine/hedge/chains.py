"""Which hedge chains a round verifies: branch positions and the per-round selection (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def effective_positions(configured: Sequence[int], drafts_per_round: int) -> tuple[int, ...]:
    """Sorted, deduplicated branch positions the drafter can produce (p < drafts per round);
    none configured means position 0."""
    return tuple(sorted({p for p in (configured or (0,)) if p < drafts_per_round}))


@dataclass(frozen=True)
class Candidate:
    """One request of the round: may it hedge (greedy), and how many drafts may it accept."""

    greedy: bool
    limit: int


def plan_chains(
    candidates: Sequence[Candidate],
    positions: Sequence[int],
    span: int,
    cap: int,
    knee: int,
    slots: int,
) -> list[tuple[int, int]]:
    """(request index, position index) of every chain to verify this round, request-major: a chain at
    each of `positions` (this round's, all < its k) below the request's limit, first come, first served
    among greedy requests, at most `cap` of them; `knee` > 0 caps the round's verify rows (main +
    chains) x span, `slots` the chains (what the scratch KV holds) (docs/design/hedging.md)."""
    if not positions or cap <= 0 or span < 2:
        return []
    budget = slots
    if knee:
        budget = min(budget, knee // span - len(candidates))
    chosen: list[tuple[int, int]] = []
    hedged = 0
    for i, c in enumerate(candidates):
        if hedged == cap or budget <= 0:
            break
        if not c.greedy:
            continue
        mine = [j for j, p in enumerate(positions) if p < c.limit][:budget]
        if mine:
            chosen += [(i, j) for j in mine]
            budget -= len(mine)
            hedged += 1
    return chosen
