"""Pure-Python tools over the engine's text output: trace parsing, summaries, the run record.

Imports nothing from `engine` and not torch: it only reads text."""
from trace_tools.parse import LosslessLine, RoundRow, TraceError, levers_trace_rows, lossless_lines
from trace_tools.record import BEGIN, END, RecordError, RecordHeader, RecordRow, paste, render_record
from trace_tools.summary import ChildSummary, summarize, unresumed_requests

__all__ = [
    "BEGIN", "END", "ChildSummary", "LosslessLine", "RecordError", "RecordHeader", "RecordRow",
    "RoundRow", "TraceError", "levers_trace_rows", "lossless_lines", "paste", "render_record",
    "summarize", "unresumed_requests",
]
