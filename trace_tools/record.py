"""The levers-gate run record (a Markdown table) and pasting it into a doc between markers."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from trace_tools.results import ExcusedLine

RECORDS_DIR = "gate-records"  # where the gate writes its records, under the directory it ran in
BEGIN = "<!-- run-record:begin -->"
END = "<!-- run-record:end -->"
COLUMNS = ("child", "env", "gated rows", "speculating rows", "max drafts", "compared tokens", "excused", "verdict")
HEDGE_COLUMN = "hedge chains / wins"  # appended only when a row carries hedge counts
_CASES = re.compile(r"^- cases: ([0-9]+) of ([0-9]+)\r?$", re.MULTILINE)
_CANARIES = re.compile(r"^- canaries: ([0-9]+) of ([0-9]+) caught\r?$", re.MULTILINE)


class RecordError(ValueError):
    """A doc or record that cannot be pasted without guessing."""


@dataclass(frozen=True)
class RecordRow:
    child: str
    env: str
    gated_rounds: int
    speculating_rounds: int
    max_drafts: int | None  # None: no speculating row
    compared_tokens: int | None  # None: the child printed no [lossless] line
    excused: int | None  # near-tie positions excused by the lossless check
    passed: bool
    hedge_chains: int | None = None  # the hedge case: chains verified (None: not a hedge case)
    hedge_wins: int | None = None  # the hedge case: request-rounds a chain won


@dataclass(frozen=True)
class ExcuseRow:
    """One near-tie a case's lossless check excused (its child's `[excused]` line)."""

    case: str
    excuse: ExcusedLine


@dataclass(frozen=True)
class CanaryRow:
    """One canary: the planted bug, the case it ran on, and whether the verdict named its invariant
    (`named`: the problem that did, else what the verdict said instead)."""

    name: str
    bug: str
    case: str
    caught: bool
    named: str


@dataclass(frozen=True)
class RecordHeader:
    head: str
    device: str
    weights: str
    date: str
    command: str
    cases_run: int  # cases of the gate this session ran (a `-k` or node-id run runs fewer)
    cases_total: int
    canaries_total: int = 0  # canaries the gate holds (each caught one is a CanaryRow with caught)


def _cell(value: object) -> str:
    return "-" if value is None else str(value).replace("|", r"\|")


def render_record(
    header: RecordHeader,
    rows: Sequence[RecordRow],
    excuses: Sequence[ExcuseRow] = (),
    canaries: Sequence[CanaryRow] = (),
) -> str:
    """The record file: a header block, one table row per case (with a hedge column when a row
    carries hedge counts), every excused near-tie, and the canaries."""
    hedged = any(r.hedge_chains is not None for r in rows)
    columns = (*COLUMNS, HEDGE_COLUMN) if hedged else COLUMNS
    lines = [
        f"- head: `{header.head}`",
        f"- device: {_cell(header.device)}",
        f"- weights: {_cell(header.weights)}",
        f"- date: {header.date}",
        f"- command: `{header.command}`",
        f"- cases: {header.cases_run} of {header.cases_total}",
        *(
            [f"- canaries: {sum(c.caught for c in canaries)} of {header.canaries_total} caught"]
            if header.canaries_total
            else []
        ),
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
    ]
    for r in rows:
        cells = (
            r.child,
            r.env,
            r.gated_rounds,
            r.speculating_rounds,
            r.max_drafts,
            r.compared_tokens,
            r.excused,
            "pass" if r.passed else "FAIL",
        )
        if hedged:
            cells += (None if r.hedge_chains is None else f"{r.hedge_chains} / {r.hedge_wins}",)
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    lines += _excuse_table(excuses) + _canary_table(canaries)
    return "\n".join(lines) + "\n"


def _table(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    head = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return head + ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]


def _excuse_table(excuses: Sequence[ExcuseRow]) -> list[str]:
    if not excuses:
        return ["", "Excused near-ties: none."]
    rows = [
        (r.case, e.request, e.position, e.token, e.top, f"{e.gap:.4g}", f"{e.bound:.4g}", _ratio(e))
        for r, e in ((r, r.excuse) for r in excuses)
    ]
    columns = ("case", "request", "output token", "emitted", "fp32 top", "fp32 gap", "bound", "gap / bound")
    return ["", "Excused near-ties (gates/near_tie.py):", "", *_table(columns, rows)]


def _ratio(e: ExcusedLine) -> str:
    return f"{e.gap / e.bound:.2f}" if e.bound > 0 else "-"


def _canary_table(canaries: Sequence[CanaryRow]) -> list[str]:
    if not canaries:
        return []
    rows = [(c.name, c.bug, c.case, "caught" if c.caught else "NOT CAUGHT", c.named) for c in canaries]
    columns = ("canary", "planted bug", "case", "verdict", "what the verdict said")
    return ["", "Canaries (gates/canaries.py):", "", *_table(columns, rows)]


def paste(doc_text: str, table_text: str) -> str:
    """doc_text with everything between the run-record markers replaced by table_text.

    Every byte outside the markers is kept; pasting twice equals pasting once. A doc
    without exactly one begin marker followed by exactly one end marker is an error:
    appending somewhere would be a guess. A record of a run that did not run every case
    (or that does not say) is refused: a doc shows whole gate runs only."""
    for marker in (BEGIN, END):
        found = doc_text.count(marker)
        if found != 1:
            raise RecordError(f"the doc must hold exactly one {marker}, found {found}")
        if marker in table_text:
            raise RecordError(f"the record itself holds {marker}; refusing to nest markers")
    start = doc_text.index(BEGIN) + len(BEGIN)
    end = doc_text.index(END)
    if end < start:
        raise RecordError(f"{END} comes before {BEGIN}")
    body = table_text.strip("\r\n")
    if not body.strip():
        raise RecordError("the record is empty")
    cases = _CASES.search(table_text)
    if cases is None:
        raise RecordError("the record has no `- cases: N of M` line; refusing a record that may be partial")
    run, total = int(cases.group(1)), int(cases.group(2))
    if run < total:
        raise RecordError(f"the record ran {run} of {total} cases; refusing to paste a partial run")
    canaries = _CANARIES.search(table_text)
    if canaries is not None and int(canaries.group(1)) < int(canaries.group(2)):
        raise RecordError(
            f"the record's gate caught {canaries.group(1)} of {canaries.group(2)} canaries; refusing to paste a run "
            "that did not run them all or could not see every planted bug"
        )
    nl = "\r\n" if "\r\n" in doc_text else "\n"  # keep the doc's line endings
    return doc_text[:start] + nl + nl.join(re.split(r"\r?\n", body)) + nl + doc_text[end:]
