"""The levers-gate run record (a Markdown table) and pasting it into a doc between markers."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

BEGIN = "<!-- run-record:begin -->"
END = "<!-- run-record:end -->"
COLUMNS = ("child", "env", "gated rows", "speculating rows", "max drafts", "excused divergences", "verdict")
HEDGE_COLUMN = "hedge chains / wins"  # appended only when a row carries hedge counts


class RecordError(ValueError):
    """A doc or record that cannot be pasted without guessing."""


@dataclass(frozen=True)
class RecordRow:
    child: str
    env: str
    gated_rounds: int
    speculating_rounds: int
    max_drafts: int | None  # None: no speculating row
    excused_divergences: int | None  # None: the child printed no [lossless] line
    passed: bool
    hedge_chains: int | None = None  # the hedge case: chains verified (None: not a hedge case)
    hedge_wins: int | None = None  # the hedge case: request-rounds a chain won


@dataclass(frozen=True)
class RecordHeader:
    head: str
    device: str
    weights: str
    date: str
    command: str


def _cell(value: object) -> str:
    return "-" if value is None else str(value).replace("|", r"\|")


def render_record(header: RecordHeader, rows: Sequence[RecordRow]) -> str:
    """The record file: a header block, then one table row per case (with a hedge column when a row
    carries hedge counts)."""
    hedged = any(r.hedge_chains is not None for r in rows)
    columns = (*COLUMNS, HEDGE_COLUMN) if hedged else COLUMNS
    lines = [
        f"- head: `{header.head}`",
        f"- device: {_cell(header.device)}",
        f"- weights: {_cell(header.weights)}",
        f"- date: {header.date}",
        f"- command: `{header.command}`",
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
            r.excused_divergences,
            "pass" if r.passed else "FAIL",
        )
        if hedged:
            cells += (None if r.hedge_chains is None else f"{r.hedge_chains} / {r.hedge_wins}",)
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def paste(doc_text: str, table_text: str) -> str:
    """doc_text with everything between the run-record markers replaced by table_text.

    Every byte outside the markers is kept; pasting twice equals pasting once. A doc
    without exactly one begin marker followed by exactly one end marker is an error:
    appending somewhere would be a guess."""
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
    nl = "\r\n" if "\r\n" in doc_text else "\n"  # keep the doc's line endings
    return doc_text[:start] + nl + nl.join(re.split(r"\r?\n", body)) + nl + doc_text[end:]
