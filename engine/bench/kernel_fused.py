"""The fused kernels' table entries from kernel_ab's rows: at each row count, the prefetched fused
config (`prefetch: norm→q|k|v [...]` and its kin) that beats the unfused pair as dispatched there
(`norm→q|k|v`) by a margin joins the shipped table, for a decode A/B of the two tables
(`python -m engine.bench.kernel_ab --fused-table FILE`, then `decode_ab --after-tables FILE`)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

from engine.bench import kernel_cases as cases
from engine.kernels._triton import next_pow2
from engine.kernels.tuning import SkinnyConfig, TunedTables

FUSED_OPS = {  # kernel_ab label -> (tuned-table section, weight shape key)
    "norm→q|k|v": ("add_rms_norm_linear", cases.SHAPES[0]),
    "norm→gate|up": ("add_rms_norm_linear", cases.SHAPES[2]),
    "SwiGLU→down": ("silu_mul_linear", cases.DOWN_SHAPE),
}


def fused_winners(rows: Sequence[dict], margin: float = 0.03) -> dict[tuple[str, int], tuple[SkinnyConfig, float]]:
    """(op, M) -> (config, fused / pair) for the prefetched fused configs faster than the unfused pair
    as dispatched at that M by more than `margin`."""
    pair = {(r["op"], r["M"]): r["after_us"] for r in rows if r["op"] in FUSED_OPS}
    best: dict[tuple[str, int], tuple[SkinnyConfig, float]] = {}
    for r in rows:
        if not r["op"].startswith("prefetch: "):
            continue
        op, cfg = r["op"][len("prefetch: ") :].rsplit(" [", 1)
        base = pair.get((op, r["M"]))
        if base is None or r["after_us"] > (1.0 - margin) * base:
            continue
        ratio = r["after_us"] / base
        if (op, r["M"]) not in best or ratio < best[op, r["M"]][1]:
            best[op, r["M"]] = (SkinnyConfig(*json.loads("[" + cfg)), ratio)
    return best


def with_fused(tables: TunedTables, winners: dict[tuple[str, int], tuple[SkinnyConfig, float]]) -> TunedTables:
    """`tables` with each winner as its section's entry for the winner's M bucket (the next power of two)."""
    sections = {
        "add_rms_norm_linear": dict(tables.add_rms_norm_linear),
        "silu_mul_linear": dict(tables.silu_mul_linear),
    }
    for (op, m), (cfg, _) in winners.items():
        section, shape = FUSED_OPS[op]
        sections[section][shape] = {**sections[section].get(shape, {}), next_pow2(m): cfg}
    return dataclasses.replace(tables, **sections)
