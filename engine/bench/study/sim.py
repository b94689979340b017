"""The sweep's closed loop (closed_loop.py) replayed on step costs (model.py): c slots, finished
requests replaced by one prefill (after the round launched ahead, where one is: engine/decode_overlap.py),
each speculative request-round committing a draw (the profile's or the drafter's own: draws.py); an
arm's tok/s and the (plan, batch) steps it replayed."""

from __future__ import annotations

import bisect
import itertools
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

from engine.bench.study.model import StepCosts, committed_pmf
from engine.levers import gated
from engine.policy.span import SpanPolicy
from engine.scheduler import Plan

# (request index in admission order, tokens it has output) -> the leading drafts its drafter gets right
Accepted: TypeAlias = Callable[[int, int], int]


@dataclass
class SimResult:
    steps: list[tuple[str, int]] = field(default_factory=list)  # (plan value, requests), in order
    tokens: int = 0
    ms: float = 0.0

    @property
    def tok_s(self) -> float:
        return 1e3 * self.tokens / self.ms if self.ms > 0 else 0.0


def simulate_closed_loop(
    costs: StepCosts,
    concurrency: int,
    requests: int,
    new_tokens: int,
    drafts: int | None = None,
    conditional: Sequence[float] = (),
    gate: int = 0,
    buckets: Sequence[int] = (),
    seed: int = 0,
    draws: Iterator[int] | None = None,
    policy: SpanPolicy | None = None,
    accepted: Accepted | None = None,
) -> SimResult:
    """drafts None: plain decode; gate N gates rounds of >= N requests; buckets: a step of n requests
    runs the graphs of the first bucket >= n; draws: the request-rounds' accepted-draft counts in order
    (default: seeded from `conditional`); accepted: request i's draws by tokens output (draws.py);
    policy: the adaptive span policy choosing and observing each round as the engine's does."""
    if concurrency < 1 or requests < 1 or new_tokens < 1:
        raise ValueError(f"need concurrency, requests, new_tokens >= 1 (got {concurrency}, {requests}, {new_tokens})")
    draw = _request_drawer(conditional, seed, draws, accepted, new_tokens)
    engine = "plain" if drafts is None else "spec"
    res = SimResult()
    waiting, running, ids = requests, [], []  # running: tokens left; ids: admission indices
    held = False  # a speculative round launched ahead: the next step runs it before any prefill
    while waiting or running:
        admitting = bool(waiting) and len(running) < concurrency
        if admitting and not held:
            n = min(concurrency - len(running), waiting)
            ids += range(requests - waiting, requests - waiting + n)
            waiting -= n
            res.steps.append((Plan.PREFILL.value, n))
            res.ms += costs.prefill_ms(engine, n)
            res.tokens += n  # each admitted request's first token
            running += [new_tokens - 1] * n
        else:
            n, k = len(running), drafts or 0
            if drafts is None:
                plan = Plan.DECODE.value
            else:
                gate_on = gated(n, gate)
                if policy is not None and not gate_on:  # nothing waiting: the wave's remaining tokens, as the engine
                    k = policy.decide(n, drafts, None if waiting else list(running), max(running) - 1)
                plan = Plan.GATED.value if gate_on or k == 0 else Plan.SPECULATIVE.value
            res.steps.append((plan, n))
            ms = costs.step_ms(plan, n, _bucket(n, buckets), k)
            res.ms += ms
            if policy is not None and drafts is not None:
                policy.observe_wall(n, 0 if plan == Plan.GATED.value else k, ms)
            if plan == Plan.SPECULATIVE.value:
                limits = [min(k, left - 1) for left in running]
                useful = (
                    policy is None or max(left - 1 - lim for left, lim in zip(running, limits, strict=True)) > drafts
                )
                held = not admitting and useful and any(left >= k + 2 for left in running)
                got = [min(draw(i, left, k), limit) for i, left, limit in zip(ids, running, limits, strict=True)]
                if policy is not None:
                    policy.observe(limits, got)
                commits = [1 + a for a in got]
            else:
                commits = [1] * n
                if policy is not None and drafts is not None:
                    policy.gated()
            res.tokens += sum(commits)
            running = [left - k for left, k in zip(running, commits, strict=True)]
            held = plan == Plan.SPECULATIVE.value and held and any(left > 0 for left in running)
        ids = [i for i, left in zip(ids, running, strict=True) if left > 0]
        running = [left for left in running if left > 0]
    return res


def _request_drawer(
    conditional: Sequence[float], seed: int, draws: Iterator[int] | None, accepted: Accepted | None, new_tokens: int
) -> Callable[[int, int, int], int]:
    """draw(request index, tokens left, k): the accepted-draft count of one request-round of k drafts."""
    if accepted is not None:
        return lambda i, left, k: min(accepted(i, new_tokens - left), k)
    if draws is not None:
        return lambda _i, _left, _k: next(draws)
    draw = _drawer(conditional, seed)
    return lambda _i, _left, k: draw(k)


def _drawer(conditional: Sequence[float], seed: int) -> Callable[[int], int]:
    """Seeded accepted-draft counts for rounds of k drafts (one generator for every k)."""
    rng, cdfs = random.Random(seed), {}

    def draw(k: int) -> int:
        if k not in cdfs:
            cdfs[k] = list(itertools.accumulate(committed_pmf(conditional, k)))
        return min(bisect.bisect_right(cdfs[k], rng.random()), len(cdfs[k]) - 1)

    return draw


def _bucket(n: int, buckets: Sequence[int]) -> int:
    return next((b for b in sorted(buckets) if b >= n), n)
