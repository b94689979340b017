"""Cross-checks of a child's trace against the requests it ran (SPEC 9): per request and per round,
the committed tokens add up to its output, every round stays within its limits, and the drafter
context holds exactly the committed tokens but the newest (the capture is never lost).

A request's rounds are its round lines in trace order; its output starts with the prefill's token,
so after a round it holds 1 + (committed tokens so far). The final round (the one that brings the
output to its length) releases the drafter context: its draft_ctx is not checked.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from trace_tools.parse import (
    HEDGE_MARKER,
    ROUND_MARKER,
    RequestLine,
    RoundRow,
    hedge_trace_rows,
    levers_trace_rows,
)


def _name(request: int) -> str:
    return f"req-{request}"


def request_problems(rows: Sequence[RoundRow], requests: Sequence[RequestLine], stops: bool) -> list[str]:
    """What the trace and the child's request lines disagree on; empty when they agree.

    stops: the child ran with stop tokens on, so an output may end before max_tokens (on a stop
    token, possibly inside an accepted run); otherwise every output must fill its budget."""
    if not requests:
        return ["the child printed no `DFlash request` line: its trace cannot be cross-checked"]
    problems: list[str] = []
    by_id: dict[int, RequestLine] = {}
    for req in requests:
        if req.request in by_id:
            problems.append(f"the child printed two `DFlash request` lines for {_name(req.request)}")
        by_id[req.request] = req
    strangers = list(dict.fromkeys(r.request for r in rows if r.request not in by_id))
    if strangers:
        ran = ", ".join(_name(i) for i in by_id)
        names = ", ".join(_name(i) for i in strangers)
        problems.append(f"the trace names {names}, which the child never ran (it ran {ran}): the ids are wrong")
    if any(r.draft_ctx is None for r in rows):
        problems.append("round lines without draft_ctx=: the capture cannot be checked (an engine before SPEC 9?)")
    for req in by_id.values():
        problems += _one_request(req, [r for r in rows if r.request == req.request], stops)
    return problems


def _one_request(req: RequestLine, rows: Sequence[RoundRow], stops: bool) -> list[str]:
    name, problems = _name(req.request), []
    if req.output_tokens > req.max_tokens:
        problems.append(f"{name}: {req.output_tokens} output tokens over its max_tokens {req.max_tokens}")
    if not stops and req.output_tokens != req.max_tokens:
        problems.append(
            f"{name}: {req.output_tokens} of {req.max_tokens} tokens, but the child ignores EOS: "
            "the request ended early"
        )
    produced = 1  # the prefill's token
    for n, row in enumerate(rows, 1):
        kind = "gated" if row.gated else "speculating"
        where = f"{name}: {kind} round {n}"
        if produced >= req.output_tokens:
            problems.append(f"{where} ran after the request had all its {req.output_tokens} tokens")
            break
        remaining = req.max_tokens - produced
        problems += _limits(where, row, remaining)
        produced += row.committed_tokens
        final = produced >= req.output_tokens
        if row.committed_tokens < row.accepted_draft + 1 and not (final and stops):
            problems.append(
                f"{where} accepted {row.accepted_draft} drafts but committed {row.committed_tokens} tokens "
                "without stopping on a stop token"
            )
        if final or row.draft_ctx is None:
            continue
        want = req.prompt_tokens + produced - 1  # every committed token but the newest has features
        if row.draft_ctx < want:
            problems.append(
                f"{name}: {kind} round left the drafter context at {row.draft_ctx} after {want} "
                "committed tokens: the capture is lost"
            )
        elif row.draft_ctx > want:
            problems.append(
                f"{name}: {kind} round left the drafter context at {row.draft_ctx} after {want} "
                "committed tokens: rows that were not committed joined it"
            )
    if produced != req.output_tokens:
        problems.append(
            f"{name}: the prefill's token plus the trace's committed tokens make {produced}, "
            f"but the child got {req.output_tokens} output tokens"
        )
    return problems


def _limits(where: str, row: RoundRow, remaining: int) -> list[str]:
    problems = []
    if row.gated and (row.verified_draft or row.accepted_draft or row.span_limit):
        problems.append(
            f"{where} verified {row.verified_draft} and accepted {row.accepted_draft} drafts "
            f"(span_limit {row.span_limit}): a gated round verifies none"
        )
    if row.span_limit is not None and row.verified_draft > row.span_limit:
        problems.append(f"{where} verified {row.verified_draft} drafts over its span_limit {row.span_limit}")
    if row.accepted_draft > row.verified_draft:
        problems.append(f"{where} accepted {row.accepted_draft} of {row.verified_draft} verified drafts")
    if row.accepted_draft + 1 > remaining:
        problems.append(
            f"{where} accepted {row.accepted_draft} drafts with {remaining} tokens of budget left "
            f"(at most {remaining - 1} plus the bonus): the accept limit ignores the remaining budget"
        )
    if not 1 <= row.committed_tokens <= row.accepted_draft + 1:
        problems.append(
            f"{where} committed {row.committed_tokens} tokens after accepting {row.accepted_draft} drafts "
            f"(1 to {row.accepted_draft + 1} possible)"
        )
    return problems


def gated_hedges(lines: Iterable[str]) -> list[int]:
    """Requests with a `DFlash hedge` line right after a gated round of theirs (a hedge line belongs
    to the request's latest round line): hedge chains verified in a gated round."""
    latest: dict[int, bool] = {}  # request -> its latest round was gated
    found: list[int] = []
    for line in lines:
        if ROUND_MARKER.search(line):
            (row,) = levers_trace_rows([line])
            latest[row.request] = row.gated
        elif HEDGE_MARKER.search(line):
            (hedge,) = hedge_trace_rows([line])
            if latest.get(hedge.request) and hedge.request not in found:
                found.append(hedge.request)
    return found
