"""The adaptive span policy's host cost per round: `SpanPolicy.decide`, `observe` (or `gated`) and
`observe_wall` (the host term) on synthetic profile-shaped cost tables, timed on the host (no device
work); each batch with requests waiting (K valued per round) and draining (K valued over the wave of
the requests' remaining tokens, 64 each at its start: engine/drain.py), on a table where speculation
pays (every round speculates) and on one whose drafter makes it a loss (every round is gated: the
high-load case, where the gate arms pay nothing). As in the engine (engine/round.py), a gated round
plans the next round's decision while the device runs it: that round then pays `apply` on its
critical path (`us_*`), and the plan is timed apart (`planned_us_median`, off the critical path).

    python -m engine.bench policy-cost --batches 1 16 64 256 --out policy-cost.csv
"""

from __future__ import annotations

import argparse
import logging
import random
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

from engine.bench.common import setup_logging
from engine.bench.report import write_csv
from engine.policy.costs import CostTable
from engine.policy.span import SpanPolicy

log = logging.getLogger(__name__)
TABLE_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def synthetic_table(per_round: int, draft_scale: float = 1.0) -> CostTable:
    """A table shaped like a profile: flat under a knee of rows, linear above; the drafter grows with
    the batch (draft_scale 200: a drafter dear enough that every round at every batch is gated)."""
    rows = [
        {"kind": "verify", "batch": b, "span": s, "ms": 7.0 + max(0, b * s - 512) * 0.004}
        for b in TABLE_BATCHES
        for s in range(1, per_round + 2)
    ]
    rows += [{"kind": "draft", "batch": b, "span": 0, "ms": draft_scale * (1.0 + 0.045 * b)} for b in TABLE_BATCHES]
    return CostTable.from_rows(rows)


def time_rounds(
    policy: SpanPolicy, batch: int, rounds: int, rng: random.Random, draining: bool
) -> tuple[list[float], list[float]]:
    """Microseconds per round on the critical path (decide, or apply of the plan the gated round
    before made, + observe or gated + observe_wall, in the engine's order) and of the plans gated
    rounds make for their successor (during the device's round)."""
    times, planned, plan = [], [], None
    for i in range(rounds):
        accepted = [rng.randint(0, policy.per_round) for _ in range(batch)]
        wall_ms = 10.0 + rng.random()
        remaining = [64 - i % 64] * batch if draining else None
        start = time.perf_counter()
        k = policy.apply(plan) if plan is not None else policy.decide(batch, remaining=remaining)
        plan = None
        if k:
            policy.observe([k] * batch, [min(a, k) for a in accepted])
        else:
            launched = time.perf_counter()  # the engine plans here, while the device runs the round
            if not draining or remaining[0] > 1:
                plan = policy.plan(batch, remaining=[r - 1 for r in remaining] if draining else None)
            planned.append((time.perf_counter() - launched) * 1e6)
            start += time.perf_counter() - launched
            policy.gated()
        policy.observe_wall(batch, k, wall_ms)
        times.append((time.perf_counter() - start) * 1e6)
    return times, planned


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine.bench policy-cost", description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64, 256])
    p.add_argument("--drafts", type=int, default=15, help="drafts per round (the drafter's block - 1)")
    p.add_argument("--rounds", type=int, default=2000)
    p.add_argument("--out", type=Path, default=None, help="CSV of the per-batch medians")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    setup_logging(args.verbose)
    if min(args.batches) < 1 or args.drafts < 1 or args.rounds < 10:
        raise SystemExit("--batches and --drafts must be >= 1, --rounds >= 10")
    tables = {"speculating": synthetic_table(args.drafts), "gated": synthetic_table(args.drafts, 200.0)}
    rng, rows = random.Random(0), []
    for kind, batch, draining in ((t, b, d) for t in tables for b in args.batches for d in (False, True)):
        policy = SpanPolicy(tables[kind], args.drafts)
        us, planned = time_rounds(policy, batch, args.rounds, rng, draining)
        us, plan_us = us[args.rounds // 10 :], statistics.median(planned) if planned else 0.0
        q = statistics.quantiles(us, n=20)
        gated = policy.chosen[0] / policy.chosen.total()
        row = {"rounds": kind, "batch": batch, "drafts": args.drafts, "draining": int(draining)}
        row |= {"gated_share": gated, "us_median": statistics.median(us), "us_p5": q[0], "us_p95": q[-1]}
        rows.append(row | {"planned_us_median": plan_us})
        what = f"{kind} rounds ({100 * gated:.0f} % gated), batch {batch}{' draining' if draining else ''}"
        log.info(
            "%s: %.1f us median per round (p5 %.1f, p95 %.1f), %.1f planned during the device's round",
            *(what, statistics.median(us), q[0], q[-1], plan_us),
        )
    if args.out:
        write_csv(args.out, rows)
    return 0
