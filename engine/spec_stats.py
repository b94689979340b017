"""The speculative path's counters (`SpecStats`, engine.stats) and one request's round outcome."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RoundOutcome:
    """One request's speculative round: drafts it could accept, accepted, tokens committed."""

    verified_draft: int
    accepted_draft: int
    committed: int


@dataclass
class SpecStats:
    """Counters of the speculative path; rounds count request-rounds (one per request per verify)."""

    rounds: int = 0
    gated_rounds: int = 0
    draft_forwards: int = 0
    drafts: int = 0
    draft_tokens_verified: int = 0
    draft_tokens_accepted: int = 0
    committed_tokens: int = 0
    accepted_by_position: list[int] = field(default_factory=list)
    hedged_rounds: int = 0  # request-rounds that verified at least one chain
    hedge_chains: int = 0  # chains verified
    hedge_wins: int = 0  # request-rounds a chain won

    @property
    def tokens_per_round(self) -> float:
        """Mean committed tokens per speculating (non-gated) request-round."""
        spec = self.rounds - self.gated_rounds
        return (self.committed_tokens - self.gated_rounds) / spec if spec else 0.0

    def count_gated(self, committed: Sequence[int]) -> None:
        """A gated round: one request-round per request, each committing its one token."""
        self.rounds += len(committed)
        self.gated_rounds += len(committed)
        self.committed_tokens += sum(committed)

    def count_round(
        self, outcomes: Sequence[RoundOutcome], chains: int, hedged: int, wins: int, per_round: int
    ) -> None:
        """A speculative round's outcomes; chains verified, request-rounds hedged and won by a chain."""
        self.rounds += len(outcomes)
        self.drafts += len(outcomes)
        self.draft_forwards += 1
        self.committed_tokens += sum(o.committed for o in outcomes)
        self.hedged_rounds += hedged
        self.hedge_chains += chains
        self.hedge_wins += wins
        self.draft_tokens_verified += sum(o.verified_draft for o in outcomes)
        self.draft_tokens_accepted += sum(o.accepted_draft for o in outcomes)
        by_pos = self.accepted_by_position
        by_pos += [0] * (per_round - len(by_pos))
        for o in outcomes:  # by_pos[p]: request-rounds that accepted more than p drafts
            for pos in range(o.accepted_draft):
                by_pos[pos] += 1
