"""The decode bench's tables: per-concurrency medians against the measured roofline."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from engine.bench import roofline
from engine.bench.report import fmt, markdown_table
from engine.bench.summary import median_of


def roofline_columns(
    config: dict,
    c: int,
    prompt_len: int,
    new_tokens: int,
    bw: float,
    rate: float,
    step_ms: float | None,
    wall_s: float | None,
    dtype_bytes: int = 2,
) -> dict:
    """Bytes per decode step (mean over the run's decode steps) at the measured bandwidth vs the measured
    median step, and the whole-workload floor vs the measured wall time."""
    steps = range(1, max(2, new_tokens))
    nbytes = statistics.mean(
        roofline.decode_step_bytes(config, roofline.decode_contexts(c, prompt_len, k), dtype_bytes) for k in steps
    )
    floor_step_ms = nbytes / bw * 1e3
    floor = roofline.workload_floor(config, c, prompt_len, new_tokens, bw, rate, dtype_bytes)
    return {
        "step_gb": nbytes / 1e9,
        "floor_step_ms": floor_step_ms,
        "bw_fraction": floor_step_ms / step_ms if step_ms else None,
        "floor_ms": floor.total_s * 1e3,
        "floor_fraction": floor.total_s / wall_s if wall_s else None,
    }


def summarize(
    raw: Sequence[dict],
    config: dict,
    concurrency: Sequence[int],
    prompt_len: int,
    new_tokens: int,
    bw: float,
    rate: float,
    dtype_bytes: int = 2,
) -> list[dict]:
    out = []
    for c in concurrency:
        ours = [r for r in raw if r["impl"] == "pegaspec" and r["concurrency"] == c]
        peer = [r for r in raw if r["impl"] == "hf" and r["concurrency"] == c]
        eager = [r for r in raw if r["impl"] == "hf-eager" and r["concurrency"] == c]
        tok_s, step_ms, wall, target_ms = (median_of(ours, k) for k in ("tok_s", "step_ms", "wall_s", "target_ms"))
        peer_tok_s = median_of(peer, "tok_s")
        row = dict(concurrency=c, tok_s=tok_s, peer_tok_s=peer_tok_s)
        row["vs_peer"] = tok_s / peer_tok_s if peer_tok_s else None
        row.update(peer_eager_tok_s=median_of(eager, "tok_s"), step_ms=step_ms, target_ms=target_ms, wall_s=wall)
        out.append(row | roofline_columns(config, c, prompt_len, new_tokens, bw, rate, step_ms, wall, dtype_bytes))
    return out


def decode_markdown(summary: Sequence[dict]) -> str:
    def pct(x):
        return "—" if x is None else f"{100 * x:.0f} %"

    rows = []
    for s in summary:
        vs_peer = "—" if s["vs_peer"] is None else f"{s['vs_peer']:.2f}x"
        row = [s["concurrency"], fmt(s["tok_s"], 0), fmt(s["peer_tok_s"], 0), vs_peer, fmt(s["peer_eager_tok_s"], 0)]
        row += [fmt(s["step_ms"], 3), fmt(s["target_ms"], 3), fmt(s["step_gb"], 2), fmt(s["floor_step_ms"], 3)]
        rows.append([*row, pct(s["bw_fraction"]), fmt(s["floor_ms"], 1), pct(s["floor_fraction"])])
    header = ["c", "tok/s", "HF tok/s", "vs HF", "HF eager tok/s", "step ms", "device ms", "GB/step", "BW floor ms"]
    return markdown_table([*header, "of BW limit", "workload floor ms", "of floor"], rows) + "\n"
