"""The per-request chooser's host cost per round (policy=budget): `AdaptiveSpans.choose` then `settled` on
fake requests at batches 1..256 over a table where speculation pays, the median of many rounds, in µs.
--per-row: the verify's ms per row (0.02: batch 256 mostly gated; 0.002: it speculates, K mixed).

    python scripts/budget_cost.py [--rounds 2000] [--per-row 0.02]
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

import numpy as np

from engine.levers import Levers
from engine.policy.choice import AdaptiveSpans
from engine.policy.costs import CostTable
from engine.policy.span import SpanPolicy

BATCHES, SPANS = (1, 2, 4, 8, 16, 32, 64, 128, 256), (1, 2, 3, 5, 9, 16)


def table(per_row: float = 0.02) -> CostTable:
    rows = [{"kind": "verify", "batch": b, "span": s, "ms": 5.0 + per_row * b * s} for b in BATCHES for s in SPANS]
    rows += [{"kind": "draft", "batch": b, "span": 0, "ms": 1.0 + 0.01 * b} for b in BATCHES]
    return CostTable.from_rows(rows)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=2000)
    p.add_argument("--per-row", type=float, default=0.02)
    args = p.parse_args()
    per_round, levers, rng = 15, Levers(policy="budget"), np.random.default_rng(0)
    for n in (1, 16, 64, 256):
        spans = AdaptiveSpans(SpanPolicy(table(args.per_row), per_round, learn_host=False))
        spans.per_request = True
        reqs = [SimpleNamespace(slot=i, index=i, remaining=10_000, num_kv=100) for i in range(n)]
        choose, settle, gated = [], [], 0
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            ks = spans.choose(reqs, levers, False)
            t1 = time.perf_counter()
            limits = [ks] * n if isinstance(ks, int) else ks
            accepted = [int(rng.integers(0, k + 1)) for k in limits]
            t2 = time.perf_counter()
            spans.settled(max(limits), reqs, limits, accepted)
            t3 = time.perf_counter()
            choose.append(t1 - t0)
            settle.append(t3 - t2)
            gated += max(limits) == 0
        med = statistics.median
        print(
            f"batch {n:3d}: choose {med(choose) * 1e6:6.1f} µs, settled {med(settle) * 1e6:6.1f} µs a round "
            f"({100 * gated / args.rounds:.0f} % gated)"
        )


if __name__ == "__main__":
    main()
