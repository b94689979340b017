"""Synthetic cost tables for the adaptive span policy's tests (rows shaped like `engine.bench profile`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from engine.policy.costs import CostTable

BATCHES = (1, 2, 3, 4, 8, 16, 32, 64)


def table(
    verify: Callable[[int, int], float],
    draft: Callable[[int], float],
    spans: Sequence[int],
    batches: Sequence[int] = BATCHES,
) -> CostTable:
    """verify(batch, span) and draft(batch) in ms at every batch and span."""
    rows = [{"kind": "verify", "batch": b, "span": s, "ms": verify(b, s)} for b in batches for s in spans]
    rows += [{"kind": "draft", "batch": b, "span": 0, "ms": draft(b)} for b in batches]
    return CostTable.from_rows(rows)


def csv_text(t: CostTable) -> str:
    lines = ["kind,batch,span,ms"]
    lines += [f"verify,{b},{s},{ms}" for (b, s), ms in sorted(t.verify.items())]
    lines += [f"draft,{b},0,{ms}" for b, ms in sorted(t.draft.items())]
    return "\n".join(lines) + "\n"
