"""serve-load numbers: one row per (rate, repeat, arm) run, then medians per (rate, arm) and the table."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import numpy as np

from engine.bench.open_loop import RequestRecord
from engine.bench.report import fmt, markdown_table

METRICS = ("output_tok_s", "req_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "tpot_p50_ms", "tau")


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in [0, 100]), numpy's default; None for no values."""
    return float(np.percentile(values, q)) if len(values) else None


def _ms(value: float | None) -> float | None:
    return None if value is None else value * 1e3


def run_row(
    rate: float, repeat: int, arm: str, records: Sequence[RequestRecord], wall_s: float, spec: dict[str, float]
) -> dict:
    """One run's row; `spec` is the server's /metrics delta over the run (rounds, committed tokens)."""
    ok = [r for r in records if r.error is None]
    ttft = [r.ttft for r in ok if r.ttft is not None]
    gaps = [g for r in ok for g in r.gaps]
    tpot = [r.tpot for r in ok if r.tpot is not None]
    tokens = sum(r.output_tokens for r in ok)
    rounds = spec.get("rounds", 0) - spec.get("gated_rounds", 0)
    tau = (spec.get("committed_tokens", 0) - spec.get("gated_rounds", 0)) / rounds if rounds > 0 else None
    row = dict(rate=rate, repeat=repeat, arm=arm, requests=len(records), errors=len(records) - len(ok), wall_s=wall_s)
    per_s = (lambda n: n / wall_s) if wall_s > 0 else (lambda n: None)
    row.update(output_tokens=tokens, output_tok_s=per_s(tokens), req_s=per_s(len(ok)))
    row.update(ttft_p50_ms=_ms(percentile(ttft, 50)), ttft_p99_ms=_ms(percentile(ttft, 99)))
    row.update(itl_p50_ms=_ms(percentile(gaps, 50)), itl_p99_ms=_ms(percentile(gaps, 99)))
    row.update(tpot_p50_ms=_ms(percentile(tpot, 50)), tau=tau, gated_rounds=spec.get("gated_rounds", 0))
    row.update(launched_ahead=spec.get("launched_ahead", 0), launched_ahead_used=spec.get("launched_ahead_used", 0))
    return row | dict(first_error=next((r.error for r in records if r.error), ""))


def summarize(rows: Sequence[dict], arms: Sequence[str]) -> list[dict]:
    """Per (rate, arm): the median of each metric over repeats, its spread (min..max of throughput),
    and the throughput and TTFT p50 ratios against the first arm at the same rate (paired by repeat)."""
    out = []
    for rate in sorted({r["rate"] for r in rows}):
        base = {r["repeat"]: r for r in rows if r["rate"] == rate and r["arm"] == arms[0]}
        for arm in arms:
            group = [r for r in rows if r["rate"] == rate and r["arm"] == arm]
            if not group:
                continue
            row = {"rate": rate, "arm": arm, "repeats": len(group), "errors": sum(r["errors"] for r in group)}
            for m in METRICS:
                vals = [r[m] for r in group if r[m] is not None]
                row[m] = statistics.median(vals) if vals else None
            tok = [r["output_tok_s"] for r in group if r["output_tok_s"] is not None]
            row["tok_s_min"], row["tok_s_max"] = (min(tok), max(tok)) if tok else (None, None)
            for m, key in (("output_tok_s", "tok_s_vs_first"), ("ttft_p50_ms", "ttft_vs_first")):
                ratios = [r[m] / base[r["repeat"]][m] for r in group if _paired(r, base, m)]
                row[key] = statistics.median(ratios) if ratios else None
            out.append(row)
    return out


def _paired(row: dict, base: dict[int, dict], metric: str) -> bool:
    other = base.get(row["repeat"])
    return other is not None and row[metric] is not None and bool(other[metric])


def markdown(summary: Sequence[dict], first_arm: str) -> str:
    header = ["rate (req/s)", "arm", "out tok/s (min–max)", f"× {first_arm}", "TTFT p50 / p99 (ms)"]
    header += ["ITL p50 / p99 (ms)", "TPOT p50 (ms)", "τ", "errors"]
    body = []
    for s in summary:
        tok_s = f"{fmt(s['output_tok_s'])} ({fmt(s['tok_s_min'])}–{fmt(s['tok_s_max'])})"
        ttft, itl = (f"{fmt(s[f'{m}_p50_ms'])} / {fmt(s[f'{m}_p99_ms'])}" for m in ("ttft", "itl"))
        row = [fmt(s["rate"], 1), s["arm"], tok_s, fmt(s["tok_s_vs_first"], 3), ttft, itl]
        body.append([*row, fmt(s["tpot_p50_ms"], 2), fmt(s["tau"], 2), s["errors"]])
    return markdown_table(header, body)
