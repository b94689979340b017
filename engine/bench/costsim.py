"""The sweep's closed loop replayed on a cost table (engine/bench/costmodel.py): c slots, a finished
request replaced at the next step by a prefill step, each speculative request-round committing a
seeded draw from the acceptance profile capped like the engine's draft limit. Predicts an arm's
end-to-end tok/s (prefill and drain included) without running a model."""

from __future__ import annotations

import bisect
import itertools
import random
from collections.abc import Callable, Sequence

from engine.bench.costmodel import CostTable, committed_pmf


def simulate_closed_loop(
    table: CostTable,
    concurrency: int,
    requests: int,
    new_tokens: int,
    prefill_ms: Callable[[int], float],
    drafts: int | None = None,
    conditional: Sequence[float] = (),
    gate: int = 0,
    buckets: Sequence[int] = (),
    seed: int = 0,
) -> float:
    """Output tok/s of the closed loop. drafts None = plain decode; gate N gates rounds of >= N
    requests; buckets: a step of n requests costs the table at the first bucket >= n (graph padding).
    prefill_ms(n): one prefill step admitting n requests (each emits its first token)."""
    if concurrency < 1 or requests < 1 or new_tokens < 1:
        raise ValueError(f"need concurrency, requests, new_tokens >= 1 (got {concurrency}, {requests}, {new_tokens})")
    rng = random.Random(seed)
    cdf = list(itertools.accumulate(committed_pmf(conditional, drafts))) if drafts is not None else []
    waiting, running, clock, tokens = requests, [], 0.0, 0
    while waiting or running:
        if waiting and len(running) < concurrency:
            n = min(concurrency - len(running), waiting)
            waiting -= n
            clock += prefill_ms(n)
            tokens += n
            running += [new_tokens - 1] * n
        else:
            n = len(running)
            rows = _bucket(n, buckets)
            if drafts is None or (gate and n >= gate):
                clock += table.decode_ms(rows) if drafts is None else table.gated_ms(rows)
                commits = [1] * n
            else:
                clock += table.round_ms(rows, drafts)
                commits = [1 + min(_draw(rng, cdf), drafts, left - 1) for left in running]
            tokens += sum(commits)
            running = [left - k for left, k in zip(running, commits, strict=True)]
        running = [left for left in running if left > 0]
    return 1e3 * tokens / clock


def _draw(rng: random.Random, cdf: Sequence[float]) -> int:
    return min(bisect.bisect_right(cdf, rng.random()), len(cdf) - 1)


def _bucket(n: int, buckets: Sequence[int]) -> int:
    return next((b for b in sorted(buckets) if b >= n), n)
