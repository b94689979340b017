"""Pure-Python tools over the engine's text output: trace parsing, summaries, the run record.

Imports nothing from `engine` and not torch: it only reads text."""

from trace_tools.consistency import gated_hedges, request_problems
from trace_tools.parse import (
    HedgeRow,
    KnownLine,
    LosslessLine,
    RequestLine,
    RoundRow,
    TraceError,
    hedge_trace_rows,
    known_lines,
    levers_trace_rows,
    lossless_lines,
    request_lines,
)
from trace_tools.record import (
    BEGIN,
    END,
    CanaryRow,
    ExcuseRow,
    RecordError,
    RecordHeader,
    RecordRow,
    paste,
    render_record,
)
from trace_tools.summary import ChildSummary, HedgeSummary, summarize, summarize_hedge, unresumed_requests

__all__ = [
    "BEGIN",
    "END",
    "CanaryRow",
    "ChildSummary",
    "ExcuseRow",
    "HedgeRow",
    "HedgeSummary",
    "KnownLine",
    "LosslessLine",
    "RecordError",
    "RecordHeader",
    "RecordRow",
    "RequestLine",
    "RoundRow",
    "TraceError",
    "gated_hedges",
    "hedge_trace_rows",
    "known_lines",
    "levers_trace_rows",
    "lossless_lines",
    "paste",
    "render_record",
    "request_lines",
    "request_problems",
    "summarize",
    "summarize_hedge",
    "unresumed_requests",
]
