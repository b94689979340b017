"""The verdict on one child: its exit code, its trace against the case and against its own requests,
its lossless lines; and the row and gate line that report it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gates.cases import CAPTURE, Expect, LeverCase
from gates.checks import check_case
from gates.child import CHILD_TIMEOUT_S
from gates.result_checks import capture_problems, server_problems
from trace_tools import (
    HedgeRow,
    KnownLine,
    LosslessLine,
    RecordRow,
    RequestLine,
    RoundRow,
    TraceError,
    gated_hedges,
    hedge_trace_rows,
    known_lines,
    levers_trace_rows,
    lossless_lines,
    request_lines,
    request_problems,
    summarize,
    summarize_hedge,
)
from trace_tools.results import (
    ExcusedLine,
    capture_lines,
    excused_lines,
    lossless_failures,
    resume_lines,
    server_lines,
)
from trace_tools.summary import ChildSummary, HedgeSummary


@dataclass(frozen=True)
class CaseResult:
    case: LeverCase
    summary: ChildSummary
    compared_tokens: int | None  # None: no [lossless] line
    excused: int | None
    problems: tuple[str, ...]
    hedge: HedgeSummary | None = None  # hedge cases only
    known: KnownLine | None = None  # known-continuation cases only
    excuses: tuple[ExcusedLine, ...] = ()  # every near-tie the child excused

    @property
    def weights(self) -> str | None:
        """How the run record names a known-continuation child's pair (the child picks the geometry)."""
        k = self.known
        return None if k is None else f"known:{k.geometry} + modelled drafter ({k.profile})"

    @property
    def row(self) -> RecordRow:
        s, h = self.summary, self.hedge
        return RecordRow(
            self.case.child,
            self.case.env_label,
            s.gated_rounds,
            s.speculating_rounds,
            s.max_drafts,
            self.compared_tokens,
            self.excused,
            passed=not self.problems,
            hedge_chains=None if h is None else h.chains,
            hedge_wins=None if h is None else h.wins,
        )


def check_child(
    case: LeverCase, returncode: int | None, output: str, timeout_s: float = CHILD_TIMEOUT_S, exact: bool = False
) -> CaseResult:
    """The verdict on one child: it exited 0, its trace shows the case and agrees with its requests,
    its [lossless] lines compared every token it requested, and every near-tie it excused is listed
    and sits under its bound (none when `exact`: batch-invariant numerics)."""
    lines = output.splitlines()
    problems = []
    if returncode is None:
        problems.append(f"the child was killed after {timeout_s:g} s")
    elif returncode != 0:
        problems.append(f"the child exited {returncode}: its lossless assertions or its setup failed")
    rows: list[RoundRow] = []
    hedges: list[HedgeRow] = []
    requests: list[RequestLine] = []
    try:
        rows, hedges, requests = levers_trace_rows(lines), hedge_trace_rows(lines), request_lines(lines)
        problems += check_case(case, rows, hedges, gated_hedges(lines) if case.expect.hedged else ())
        if case.expect is Expect.SERVE:  # clients that left early have rounds but no request line
            problems += server_problems(server_lines(lines), rows, requests)
            rows_checked = [r for r in rows if r.request in {q.request for q in requests}]
        else:
            rows_checked = rows
        if case.child == CAPTURE:
            problems += capture_problems(capture_lines(lines), resume_lines(lines))
        if rows:
            problems += request_problems(rows_checked, requests, stops=case.expect is Expect.STOP)
    except TraceError as e:
        rows, problems = [], [*problems, f"unreadable trace: {e}"]
    try:
        results, excuses = lossless_lines(lines), excused_lines(lines)
    except TraceError as e:
        results, excuses, problems = [], [], [*problems, f"unreadable [lossless] or [excused] line: {e}"]
    problems += [f"the lossless check failed: {m}" for m in lossless_failures(lines)]
    problems += _lossless_problems(results, requests) + _excuse_problems(results, excuses, exact)
    known = None
    if case.known:
        try:
            known = known_lines(lines)
        except TraceError as e:
            known, problems = [], [*problems, f"unreadable [known] line: {e}"]
        problems += _known_problems(known, requests)
    compared = sum(r.compared_tokens for r in results) if results else None
    excused = sum(r.excused for r in results) if results else None
    hedge = summarize_hedge(hedges) if case.expect.hedged else None
    known_line = known[0] if known else None
    return CaseResult(case, summarize(rows), compared, excused, tuple(problems), hedge, known_line, tuple(excuses))


def _known_problems(known: Sequence[KnownLine], requests: Sequence[RequestLine]) -> list[str]:
    if len(known) != 1:
        return [f"{len(known)} [known] lines: the known-continuation child prints exactly one"]
    (k,) = known
    problems = []
    if k.mismatches:
        problems.append(f"{k.mismatches} of {k.requests} speculative outputs left the known continuation")
    if k.plain_mismatches:
        problems.append(
            f"{k.plain_mismatches} of {k.requests} plain outputs left the known continuation: "
            f"the {k.geometry} target does not echo its last prompt token"
        )
    produced = sum(r.output_tokens for r in requests)
    if (k.requests, k.compared_tokens) != (len(requests), produced):
        problems.append(
            f"the [known] line compared {k.compared_tokens} tokens of {k.requests} requests, but the child "
            f"ran {len(requests)} requests of {produced} tokens: part of the output went unchecked"
        )
    return problems


def _lossless_problems(results: Sequence[LosslessLine], requests: Sequence[RequestLine]) -> list[str]:
    if not results:
        return ["no [lossless] line: the child compared nothing (skipped, or failed first)"]
    compared = sum(r.compared_tokens for r in results)
    problems = []
    if compared == 0:
        problems.append("the child's [lossless] lines compared 0 tokens")
    elif requests and compared != sum(r.output_tokens for r in requests):
        problems.append(
            f"the child compared {compared} tokens but its requests produced "
            f"{sum(r.output_tokens for r in requests)}: part of the output went unchecked"
        )
    if requests and sum(r.requests for r in results) != len(requests):
        problems.append(
            f"the [lossless] lines count {sum(r.requests for r in results)} requests, the child ran {len(requests)}"
        )
    return problems


def _excuse_problems(results: Sequence[LosslessLine], excuses: Sequence[ExcusedLine], exact: bool) -> list[str]:
    excused = sum(r.excused for r in results)
    problems = []
    if excused != len(excuses):
        problems.append(f"the [lossless] lines excused {excused} near-ties but {len(excuses)} are listed")
    if exact and excuses:
        problems.append(f"{len(excuses)} near-ties excused: batch-invariant numerics excuse none")
    for e in excuses:
        if not e.gap <= e.bound:
            problems.append(
                f"{e.request} output token {e.position} was excused {e.gap:.4g} logits behind the fp32 top "
                f"token, over its bound {e.bound:.4g}"
            )
    return problems


def gate_line(row: RecordRow) -> str:
    max_drafts = "-" if row.max_drafts is None else row.max_drafts
    hedge = "" if row.hedge_chains is None else f" hedge_chains={row.hedge_chains} hedge_wins={row.hedge_wins}"
    compared = "-" if row.compared_tokens is None else row.compared_tokens
    excused = "-" if row.excused is None else row.excused
    return (
        f"spec lever gate: child={row.child} env={row.env} gated_rounds={row.gated_rounds} "
        f"speculating_rounds={row.speculating_rounds} max_drafts={max_drafts}{hedge} "
        f"compared_tokens={compared} excused={excused}"
    )
