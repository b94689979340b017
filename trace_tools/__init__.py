"""Pure-Python tools over the engine's text output: trace parsing, summaries, the run record.

Imports nothing from `engine` and not torch: it only reads text."""

from trace_tools.parse import (
    HedgeRow,
    LosslessLine,
    RoundRow,
    TraceError,
    hedge_trace_rows,
    levers_trace_rows,
    lossless_lines,
)
from trace_tools.record import BEGIN, END, RecordError, RecordHeader, RecordRow, paste, render_record
from trace_tools.summary import ChildSummary, HedgeSummary, summarize, summarize_hedge, unresumed_requests

__all__ = [
    "BEGIN",
    "END",
    "ChildSummary",
    "HedgeRow",
    "HedgeSummary",
    "LosslessLine",
    "RecordError",
    "RecordHeader",
    "RecordRow",
    "RoundRow",
    "TraceError",
    "hedge_trace_rows",
    "levers_trace_rows",
    "lossless_lines",
    "paste",
    "render_record",
    "summarize",
    "summarize_hedge",
    "unresumed_requests",
]
