"""The gate children's result lines beyond `[lossless]`: excused near-ties, lossless failures, the
capture-content child's `[capture]` and `[resume]` lines, the server child's `[server]` line. Same
reading rules as trace_tools.parse."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from trace_tools.parse import _check_lines, _marked

EXCUSED_MARKER = "[excused]"
FAILED_MARKER = "[lossless-failed]"
CAPTURE_MARKER = "[capture]"
RESUME_MARKER = "[resume]"
SERVER_MARKER = "[server]"


@dataclass(frozen=True)
class ExcusedLine:
    """One near-tie the lossless check excused: output position, emitted and fp32 top token, the fp32
    gap between them and the bound it had to sit under (logits; gates/near_tie.py)."""

    test: str
    request: str
    position: int
    token: int
    top: int
    gap: float
    bound: float


@dataclass(frozen=True)
class CaptureLine:
    """The drafter context a gated-then-resumed run stored against an ungated run's, over the same
    committed tokens: rows compared, of them written by gated rounds, rows whose difference exceeds
    the tolerance (any bit at tolerance 0), and the largest difference (relative to the row's largest
    value). bit_identical: 1 where the numerics promise bit-identical rows (tolerance 0)."""

    numerics: str
    bit_identical: int
    requests: int
    compared_rows: int
    gated_rows: int
    mismatched_rows: int
    max_diff: float
    tolerance: float


@dataclass(frozen=True)
class ResumeLine:
    """Acceptance after a resume: the resumed rounds (verified drafts, accepted drafts) against the
    ungated run's rounds from the same positions; mismatched: rounds whose counts differ."""

    numerics: str
    requests: int
    rounds: int
    accepted: int
    reference_accepted: int
    verified: int
    reference_verified: int
    mismatched_rounds: int


@dataclass(frozen=True)
class ServerLine:
    """The server child: requests it streamed and their tokens, clients that left before the first
    output, and, once they left, the server's aborted count, running requests and KV blocks."""

    requests: int
    completion_tokens: int
    disconnects: int
    aborted: int
    running: int
    kv_blocks_free: int
    kv_blocks_total: int


def excused_lines(lines: Iterable[str]) -> list[ExcusedLine]:
    """One ExcusedLine per `[excused]` line a lossless child printed."""
    marked = _marked(lines, EXCUSED_MARKER, ("test", "request"), ("position", "token", "top"), ("gap", "bound"))
    return [ExcusedLine(**f) for f in marked]


def lossless_failures(lines: Iterable[str]) -> list[str]:
    """The message of each `[lossless-failed]` line: the check that failed, and where."""
    _check_lines(lines)
    out = []
    for line in lines:
        at = line.find(FAILED_MARKER)
        if at >= 0:
            out.append(line[at + len(FAILED_MARKER) :].strip() or "(no message)")
    return out


def capture_lines(lines: Iterable[str]) -> list[CaptureLine]:
    counts = ("bit_identical", "requests", "compared_rows", "gated_rows", "mismatched_rows")
    return [CaptureLine(**f) for f in _marked(lines, CAPTURE_MARKER, ("numerics",), counts, ("max_diff", "tolerance"))]


def resume_lines(lines: Iterable[str]) -> list[ResumeLine]:
    counts = (
        "requests",
        "rounds",
        "accepted",
        "reference_accepted",
        "verified",
        "reference_verified",
        "mismatched_rounds",
    )
    return [ResumeLine(**f) for f in _marked(lines, RESUME_MARKER, ("numerics",), counts)]


def server_lines(lines: Iterable[str]) -> list[ServerLine]:
    counts = ("requests", "completion_tokens", "disconnects", "aborted", "running", "kv_blocks_free", "kv_blocks_total")
    return [ServerLine(**f) for f in _marked(lines, SERVER_MARKER, (), counts)]
