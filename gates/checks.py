"""What a case's trace must show: pure functions of the child's round and hedge lines, so each check
can be proven to fail on a planted fault (tests/test_gate_case_checks.py)."""

from __future__ import annotations

from collections.abc import Sequence

from gates.cases import Expect, LeverCase
from gates.child import TRACE_ENV
from trace_tools import HedgeRow, RoundRow, summarize, summarize_hedge
from trace_tools.summary import ChildSummary, HedgeSummary, resumed_and_accepted, rounds_of, rows_after_first_gate


def _requests(ids: Sequence[int]) -> str:
    return ", ".join(f"req-{i}" for i in ids)


def check_case(
    case: LeverCase, rows: Sequence[RoundRow], hedges: Sequence[HedgeRow] = (), gated_hedges: Sequence[int] = ()
) -> list[str]:
    """What the trace fails to show for this case; empty when it shows everything.
    gated_hedges: requests with a hedge line in a gated round (trace_tools.consistency.gated_hedges)."""
    if not rows:
        return [f"the child printed no DFlash round lines (does {TRACE_ENV}=1 reach the engine's stderr?)"]
    s = summarize(rows)
    return _expected(case, rows, hedges, gated_hedges, s) + (_mix_problems(rows) if case.known else [])


def _expected(
    case: LeverCase, rows: Sequence[RoundRow], hedges: Sequence[HedgeRow], gated_hedges: Sequence[int], s: ChildSummary
) -> list[str]:
    if case.expect is Expect.HEDGE:
        return _ungated(case, s) + _hedge_problems(case, summarize_hedge(hedges))
    if case.expect is Expect.HEDGE_BUDGET:
        return _hedge_problems(case, summarize_hedge(hedges)) + _span_bounds(case, rows)
    if case.expect is Expect.HEDGE_GATED:
        return _hedge_gated_problems(case, rows, s, summarize_hedge(hedges), gated_hedges)
    if case.expect is Expect.ALL_GATED:
        return _all_gated_problems(case, rows, s)
    if case.expect is Expect.TRIM:
        return _ungated(case, s) + _trim_problems(case, rows)
    if case.expect is Expect.STOP:
        return _ungated(case, s) + _stop_problems(rows)
    if case.expect is Expect.MIXED:
        return _ungated(case, s)
    if case.expect is Expect.CAPPED:
        return _capped_problems(case, rows, s)
    if case.expect is Expect.RAGGED:
        return list(dict.fromkeys(_capped_problems(case, rows, s) + _mixed_k(rows) + _resume_problems(case, rows, s)))
    if case.expect is Expect.SERVE:
        return _ungated(case, s) + (
            [] if s.speculating_rounds else ["no speculating round: the server never speculated"]
        )
    return _resume_problems(case, rows, s)  # RESUME, CAPTURE


def _mix_problems(rows: Sequence[RoundRow]) -> list[str]:
    # A round's span is capped by the remaining budget, so accepted < verified is a real rejection.
    verified = sum(r.verified_draft for r in rows)
    accepted = sum(r.accepted_draft for r in rows)
    if verified and 0 < accepted < verified:
        return []
    what = "none" if accepted == 0 else "all"
    return [
        f"the modelled drafter's drafts were {what} accepted ({accepted} of {verified} verified): "
        "the lossless check needs both accepted and rejected drafts to have power"
    ]


def _ungated(case: LeverCase, s: ChildSummary) -> list[str]:
    if s.gated_rounds:
        return [f"{s.gated_rounds} gated rounds under {case.env_label} alone: the gate must stay off"]
    return []


def _all_gated_problems(case: LeverCase, rows: Sequence[RoundRow], s: ChildSummary) -> list[str]:
    problems = []
    if s.gated_rounds == 0:
        problems.append(f"no gated round: {case.env_label} never tripped the gate")
    if s.speculating_rounds:
        spec = [r.request for r in rows if not r.gated]
        problems.append(
            f"{s.speculating_rounds} speculating rounds under {case.env_label}, which must "
            f"gate every round (requests {_requests(list(dict.fromkeys(spec)))})"
        )
    return problems


def _trim_problems(case: LeverCase, rows: Sequence[RoundRow]) -> list[str]:
    k, problems = case.value, []
    over = [r for r in rows if r.verified_draft > k]
    if over:
        problems.append(
            f"{len(over)} rounds verified more than {k} drafts "
            f"(up to {max(r.verified_draft for r in over)}): the trim leaks"
        )
    if not any(r.verified_draft == k for r in rows):
        widest = max(r.verified_draft for r in rows)
        problems.append(f"no round verified exactly {k} drafts (widest {widest}): the trim was never exercised")
    return problems


def _capped_problems(case: LeverCase, rows: Sequence[RoundRow], s: ChildSummary) -> list[str]:
    # The policy chooses K per round (span_limit); MAX_DRAFTS caps it, and on this table the policy
    # wants more (all drafts below batch 4), so some round must sit at the cap.
    cap = int(case.knob_value("MAX_DRAFTS") or 0)
    problems = []
    over = [r for r in rows if max(r.span_limit or 0, r.verified_draft) > cap]
    if over:
        widest = max(max(r.span_limit or 0, r.verified_draft) for r in over)
        problems.append(f"{len(over)} rounds chose K above MAX_DRAFTS={cap} (up to {widest}): the cap does not bound K")
    if not any(r.verified_draft == cap for r in rows):
        problems.append(f"no round verified exactly {cap} drafts: the cap never bound the policy")
    if s.gated_rounds == 0 or s.speculating_rounds == 0:
        problems.append(
            f"{s.gated_rounds} gated and {s.speculating_rounds} speculating rounds: the policy never moved K"
        )
    return problems


def _span_bounds(case: LeverCase, rows: Sequence[RoundRow]) -> list[str]:
    # Per request: its K_i (span_limit) within MAX_DRAFTS, its verified drafts within its K_i.
    cap = int(case.knob_value("MAX_DRAFTS") or 0)
    over = [r for r in rows if not r.gated and not r.verified_draft <= (r.span_limit or 0) <= cap]
    if over:
        worst = max(over, key=lambda r: (r.span_limit or 0, r.verified_draft))
        return [
            f"{len(over)} request-rounds past their bounds (e.g. req-{worst.request}: verified {worst.verified_draft} "
            f"of K_i {worst.span_limit}, MAX_DRAFTS={cap})"
        ]
    return []


def _mixed_k(rows: Sequence[RoundRow]) -> list[str]:
    # Per request K_i (span_limit): without a round whose speculating requests took different K the
    # ragged verify was never exercised. A round's lines are consecutive, one per request.
    for group in rounds_of(rows):
        if len({r.span_limit for r in group if not r.gated}) > 1:
            return []
    return ["no round verified different K for its requests: the per-request spans never mixed"]


def _stop_problems(rows: Sequence[RoundRow]) -> list[str]:
    # A stop token inside an accepted run commits fewer tokens than accepted + 1: without one the
    # case never exercised the path (the cross-check proves the request ended there).
    if any(not r.gated and r.committed_tokens < r.accepted_draft + 1 for r in rows):
        return []
    return ["no round ended on a stop token inside its accepted drafts: the stop path was never exercised"]


def _hedge_problems(case: LeverCase, h: HedgeSummary) -> list[str]:
    # Both paths must run: a win makes a chain's scratch KV and feature rows canonical, a discard
    # must leave no trace; the child's lossless comparison covers the output of both.
    if h.chains == 0:
        return [
            f"no hedge chain verified under {case.env_label} (no `DFlash hedge` line with chains > 0; "
            "is the drafter a Markov-head one?)"
        ]
    problems = []
    if h.wins == 0:
        problems.append(f"no chain won in {h.hedged_rounds} hedged rounds: the win path never ran")
    if h.discards == 0:
        problems.append(f"every one of {h.chains} chains won: the discard path never ran")
    return problems


def _hedge_gated_problems(
    case: LeverCase, rows: Sequence[RoundRow], s: ChildSummary, h: HedgeSummary, gated_hedges: Sequence[int]
) -> list[str]:
    problems = []
    if s.gated_rounds == 0:
        problems.append(f"no gated round: the batch never reached the gate under {case.env_label}")
    if h.chains == 0:
        problems.append(f"no hedge chain verified under {case.env_label}: the hedge never ran beside the gate")
    if gated_hedges:
        problems.append(f"{_requests(gated_hedges)} verified hedge chains in a gated round, which has no drafts")
    return problems


def _resume_problems(case: LeverCase, rows: Sequence[RoundRow], s: ChildSummary) -> list[str]:
    # A request that finishes while still gated never gets the chance to resume (under a 4 -> 3
    # shrink the shortest budget always does), nor does one whose later rounds verify no draft (one
    # token left: its draft limit is 0; the H200's adaptive known case), so the per-request rule applies
    # to every gated request that verifies drafts again; and at least one gated request must resume
    # and accept, which a gate that latches to plain decode can never show.
    problems = []
    if s.gated_rounds == 0:
        problems.append(f"no gated round: the batch never exceeded {case.env_label}")
    if s.speculating_rounds == 0:
        problems.append("no speculating round: speculation never resumed after the gate")
    after = rows_after_first_gate(rows)
    if after and not any(resumed_and_accepted(later) for later in after.values()):
        problems.append(
            f"no gated request ({_requests(list(after))}) later speculated and accepted a draft: the gate latches"
        )
    stalled = [
        req
        for req, later in after.items()
        if any(not r.gated and r.verified_draft > 0 for r in later) and not resumed_and_accepted(later)
    ]
    if stalled:
        problems.append(f"{_requests(stalled)} verified drafts again after being gated but never accepted one")
    return problems
