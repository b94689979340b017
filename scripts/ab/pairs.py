"""Paired, interleaved runs of two builds and their ratios.

Pair i runs both builds back to back, base first in even pairs and head first in odd ones: drift
that hits both alike (clocks, thermals, a neighbour on the host) cancels in the pair's ratio
head / base, and neither build always runs first. A run yields one value per key: its wall seconds
(key ""), or a column of a CSV it wrote, one value per row named by the --key columns.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from engine.bench.report import markdown_table, read_csv

ARMS = ("base", "head")
Values = Mapping[tuple[int, str], Mapping[str, float]]  # (pair, arm) -> key -> value


def schedule(repeats: int) -> list[tuple[int, str]]:
    """(pair, arm) in run order."""
    if repeats < 1:
        raise ValueError(f"repeats={repeats}: need at least one pair")
    return [(i, arm) for i in range(repeats) for arm in (ARMS if i % 2 == 0 else ARMS[::-1])]


@dataclass(frozen=True)
class Metric:
    file: str | None  # a CSV under the run's output directory; None: the run's wall seconds
    column: str
    keys: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str, keys: Sequence[str] = ()) -> Metric:
        if text == "wall":
            if keys:
                raise ValueError("--key needs a FILE:COLUMN metric (wall is one value a run)")
            return cls(None, "wall_s")
        file, sep, column = text.rpartition(":")
        if not (sep and file and column):
            raise ValueError(f"--metric {text!r}: wall or FILE:COLUMN (e.g. decode_summary.csv:tok_s)")
        return cls(file, column, tuple(keys))

    def read(self, out: Path, wall_s: float) -> dict[str, float]:
        """key -> value of one run whose output directory is out."""
        if self.file is None:
            return {"": wall_s}
        path = out / self.file
        if not path.is_file():
            raise ValueError(f"{path}: the run wrote no {self.file}")
        rows = read_csv(path)
        missing = [c for c in (self.column, *self.keys) if not rows or c not in rows[0]]
        if missing:
            raise ValueError(f"{path}: no rows, or no column {', '.join(missing)}")
        values: dict[str, float] = {}
        for r in rows:
            key = " ".join(f"{k}={r[k]}" for k in self.keys)
            if key in values:
                raise ValueError(f"{path}: two rows at {key or '(no --key)'}: give --key columns that name one row")
            try:
                values[key] = float(r[self.column])
            except ValueError:
                bad = f"{self.column}={r[self.column]!r}"
                raise ValueError(f"{path}: {bad} at {key or 'its row'} is not a number") from None
        return values


def paired_ratios(values: Values) -> dict[str, list[float]]:
    """key -> head / base of each complete pair, in pair order."""
    ratios: dict[str, list[float]] = {}
    for i in sorted({i for i, _ in values}):
        if (i, "base") not in values or (i, "head") not in values:
            continue
        base, head = values[i, "base"], values[i, "head"]
        if set(base) != set(head):
            raise ValueError(f"pair {i}: the builds report different rows ({sorted(base)} vs {sorted(head)})")
        for key, b in base.items():
            if b == 0:
                raise ValueError(f"pair {i}: base is 0 at {key or 'its row'}, no ratio")
            ratios.setdefault(key, []).append(head[key] / b)
    return ratios


def summarize(values: Values) -> list[dict]:
    """Per key: the builds' medians, the median ratio head / base and its min and max over pairs."""
    rows = []
    for key, ratios in paired_ratios(values).items():
        base = [v[key] for (_, arm), v in values.items() if arm == "base"]
        head = [v[key] for (_, arm), v in values.items() if arm == "head"]
        rows.append(
            {
                "key": key,
                "base": statistics.median(base),
                "head": statistics.median(head),
                "ratio": statistics.median(ratios),
                "min": min(ratios),
                "max": max(ratios),
                "pairs": len(ratios),
            }
        )
    return rows


def markdown(summary: Sequence[dict], metric: Metric) -> str:
    """The summary table; a ratio whose min … max straddles 1 is marked (its sign changes over pairs)."""
    name = metric.column if metric.file is None else f"{metric.file}:{metric.column}"
    header = ["row", f"base {name}", f"head {name}", "head / base", "min … max", "pairs"]
    body = [
        [
            s["key"] or "(run)",
            f"{s['base']:.4g}",
            f"{s['head']:.4g}",
            f"{s['ratio']:.3f}",
            f"{s['min']:.3f} … {s['max']:.3f}" + (" (straddles 1)" if s["min"] < 1 < s["max"] else ""),
            s["pairs"],
        ]
        for s in summary
    ]
    return markdown_table(header, body)
