"""Writing results: raw CSV, Markdown tables, JSON meta. Plots live in plots.py (matplotlib optional)."""

from __future__ import annotations

import csv
import json
import logging
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger(__name__)


def write_csv(path: Path, rows: Sequence[dict]) -> None:
    """Columns are the union of the rows' keys in first-seen order (rows may differ by arm kind)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fields: list[str] = []
    for row in rows:
        fields += [k for k in row if k not in fields]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, restval="")
        writer.writeheader()
        writer.writerows(rows)


def read_csv(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")


def fmt(value, digits: int = 1) -> str:
    """Table cell: '—' for missing, thousands separators for large numbers."""
    if value is None or value == "":
        return "—"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def pct(ratio: float | None, digits: int = 1) -> str:
    """A paired ratio as a signed percentage: 1.034 -> +3.4 %."""
    if ratio is None:
        return "—"
    return f"{(ratio - 1) * 100:+.{digits}f} %"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" if i else "---" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)
