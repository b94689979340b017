"""Completing hand-written round lines into a whole child output the gate can cross-check: the
SPEC 9 fields, the child's `DFlash request` lines and its [lossless] line, all consistent."""

from __future__ import annotations

from collections.abc import Sequence

from trace_tools import levers_trace_rows

PROMPT = 10  # prompt tokens of every request of a completed trace


def complete(lines: Sequence[str], test: str = "t", excuses: Sequence[tuple[float, float]] = ()) -> list[str]:
    """Each round line gains draft_ctx (the committed length but the newest, 0 on a request's last
    round) and span_limit (its verified drafts; 0 when gated); then one request line per request
    (budget = output: every request finishes on its last round), an [excused] line per (gap, bound)
    in `excuses` (req-0's output tokens 1, 2, ...) and the [lossless] line."""
    rows = levers_trace_rows(lines)
    last = {r.request: i for i, r in enumerate(rows)}
    produced: dict[int, int] = {}
    out = []
    i = 0
    for line in lines:
        if "DFlash round" not in line:
            out.append(line)
            continue
        row = rows[i]
        produced[row.request] = produced.get(row.request, 1) + row.committed_tokens
        ctx = 0 if last[row.request] == i else PROMPT + produced[row.request] - 1
        out.append(f"{line} draft_ctx={ctx} span_limit={0 if row.gated else row.verified_draft}")
        i += 1
    for req, n in produced.items():
        out.append(request_line(req, PROMPT, n, n))
    for j, (gap, bound) in enumerate(excuses, 1):
        out.append(f"[excused] test={test} request=req-0 position={j} token=5 top=6 gap={gap} bound={bound}")
    total = sum(produced.values())
    out.append(f"[lossless] test={test} requests={len(produced)} compared_tokens={total} excused={len(excuses)}")
    return out


def request_line(req: int, prompt: int, output: int, budget: int) -> str:
    return f"[DEBUG] DFlash request request=req-{req} prompt_tokens={prompt} output_tokens={output} max_tokens={budget}"
