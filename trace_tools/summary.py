"""What one child's trace shows: counts, the widest verify, and the gated-then-resumed check.

"Later" means later in the trace, i.e. later in time: the engine writes the
round lines of one process in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from trace_tools.parse import HedgeRow, RoundRow


@dataclass(frozen=True)
class ChildSummary:
    rounds: int
    gated_rounds: int
    speculating_rounds: int
    max_drafts: int | None  # widest verify over speculating rows; None when there is none
    requests: tuple[int, ...]
    gated_requests: tuple[int, ...]
    unresumed_requests: tuple[int, ...]


def rows_after_first_gate(rows: Sequence[RoundRow]) -> dict[int, list[RoundRow]]:
    """For each request that has a gated round: its rounds after its first gated one."""
    after: dict[int, list[RoundRow]] = {}
    for row in rows:
        if row.request in after:
            after[row.request].append(row)
        elif row.gated:
            after[row.request] = []
    return after


def rounds_of(rows: Sequence[RoundRow]) -> list[list[RoundRow]]:
    """The rows grouped by round: a round writes one line per request, consecutively, so a request
    seen again starts the next round."""
    rounds: list[list[RoundRow]] = []
    seen: set[int] = set()
    for row in rows:
        if row.request in seen or not rounds:
            rounds.append([])
            seen = set()
        rounds[-1].append(row)
        seen.add(row.request)
    return rounds


def resumed_and_accepted(later: Sequence[RoundRow]) -> bool:
    """A speculating round that verified and accepted at least one draft."""
    return any(not r.gated and r.verified_draft > 0 and r.accepted_draft > 0 for r in later)


def unresumed_requests(rows: Sequence[RoundRow]) -> list[int]:
    """Gated requests that never later speculate and accept a draft, in first-gated order."""
    return [req for req, later in rows_after_first_gate(rows).items() if not resumed_and_accepted(later)]


def summarize(rows: Sequence[RoundRow]) -> ChildSummary:
    speculating = [r for r in rows if not r.gated]
    return ChildSummary(
        rounds=len(rows),
        gated_rounds=len(rows) - len(speculating),
        speculating_rounds=len(speculating),
        max_drafts=max((r.verified_draft for r in speculating), default=None),
        requests=tuple(dict.fromkeys(r.request for r in rows)),
        gated_requests=tuple(rows_after_first_gate(rows)),
        unresumed_requests=tuple(unresumed_requests(rows)),
    )


@dataclass(frozen=True)
class HedgeSummary:
    hedged_rounds: int  # request-rounds that verified at least one chain
    chains: int  # chains verified
    wins: int  # request-rounds a chain won
    discards: int  # chains verified that lost (left no trace)

    @property
    def line(self) -> str:
        return f"hedged_rounds={self.hedged_rounds} chains={self.chains} wins={self.wins} discards={self.discards}"


def summarize_hedge(rows: Sequence[HedgeRow]) -> HedgeSummary:
    wins = sum(r.winner > 0 for r in rows)
    chains = sum(r.chains for r in rows)
    return HedgeSummary(hedged_rounds=len(rows), chains=chains, wins=wins, discards=chains - wins)
