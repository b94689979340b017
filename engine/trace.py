"""The per-round trace line (PEGAINFER_TEST_LOG=1), written to stderr through `logging`."""

from __future__ import annotations

import logging
import sys

TRACE = logging.getLogger("engine.trace")
# The lines trace_tools parses (docs/trace-tools.md).
ROUND_LINE = (
    "DFlash round request=%s gated=%d verified_draft=%d accepted_draft=%d committed_tokens=%d draft_ctx=%d "
    "span_limit=%d"
)
HEDGE_LINE = "DFlash hedge request=%s chains=%d winner=%d main_accepted=%d best_accepted=%d"


class _StderrHandler(logging.Handler):
    """Writes to whatever sys.stderr is at emit time (pytest may swap it)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:
            self.handleError(record)


def enable_trace() -> None:
    if not any(isinstance(h, _StderrHandler) for h in TRACE.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("[%(levelname)s] %(message)s"))
        TRACE.addHandler(handler)
    TRACE.setLevel(logging.DEBUG)
    TRACE.propagate = False


def log_round(
    request_id: str,
    gated: bool,
    verified_draft: int,
    accepted_draft: int,
    committed_tokens: int,
    draft_ctx: int,
    span_limit: int,
) -> None:
    """One verify round of one request. draft_ctx: the drafter context rows it holds after the round
    (0 once it finished); span_limit: the drafts the round allowed (0 in a gated round)."""
    TRACE.debug(
        ROUND_LINE, request_id, int(gated), verified_draft, accepted_draft, committed_tokens, draft_ctx, span_limit
    )


def log_hedge(request_id: str, chains: int, winner: int, main_accepted: int, best_accepted: int) -> None:
    """One line per hedged request per round: chains verified besides the main one, the winner
    (0 = main, i = its i-th chain), and the main and winning chains' accepted drafts."""
    TRACE.debug(HEDGE_LINE, request_id, chains, winner, main_accepted, best_accepted)
