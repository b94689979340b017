"""Table entries from kernel_ab's rows, for a decode A/B of the shipped table and the new one
(`python -m engine.bench.kernel_ab --fused-table FILE` or `--pair-table FILE`, then `decode_ab
--after-tables FILE`):
- the fused kernels': at each row count, the prefetched fused config (`prefetch: norm→q|k|v [...]`
  and its kin) that beats the unfused pair as dispatched there (`norm→q|k|v`) by a margin;
- o's and SwiGLU→down's one-row configs timed with the projection after them (`pair: o [...] →
  norm→gate|up`) that beat that pair as dispatched (the row's own "before") by a margin."""

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

PAIR_OPS = {  # kernel_ab pair -> (its first projection's tuned-table section, weight shape key)
    "o → norm→gate|up": ("linear", cases.SHAPES[1]),
    "SwiGLU→down → norm→q|k|v": ("silu_mul_linear", cases.DOWN_SHAPE),
}
Winners = dict[tuple[str, int], tuple[SkinnyConfig, float]]


def pair_winners(rows: Sequence[dict], margin: float = 0.01) -> Winners:
    """(pair, M) -> (config, after / before) for the `pair: ` rows whose config ran the pair faster
    than the dispatch did, in the same row, by more than `margin`."""
    best: Winners = {}
    for r in rows:
        if not r["op"].startswith("pair: "):
            continue
        first, rest = r["op"][len("pair: ") :].split(" [", 1)
        cfg, second = rest.split("] → ", 1)
        op, ratio = f"{first} → {second}", r["after_us"] / r["before_us"]
        if ratio < 1.0 - margin and ((op, r["M"]) not in best or ratio < best[op, r["M"]][1]):
            best[op, r["M"]] = (SkinnyConfig(*json.loads(f"[{cfg}]")), ratio)
    return best


def fused_winners(rows: Sequence[dict], margin: float = 0.03) -> Winners:
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


def with_fused(tables: TunedTables, winners: Winners, ops: dict | None = None) -> TunedTables:
    """`tables` with each winner as its section's entry for the winner's M bucket (the next power of
    two); ops: the winners' label -> (section, shape) map (FUSED_OPS by default, or PAIR_OPS)."""
    ops = FUSED_OPS if ops is None else ops
    sections = {name: dict(getattr(tables, name)) for name in ("linear", "add_rms_norm_linear", "silu_mul_linear")}
    for (op, m), (cfg, _) in winners.items():
        section, shape = ops[op]
        sections[section][shape] = {**sections[section].get(shape, {}), next_pow2(m): cfg}
    return dataclasses.replace(tables, **sections)
