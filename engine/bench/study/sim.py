"""The sweep's closed loop (closed_loop.py) replayed on step costs (model.py): c slots, finished
requests replaced by one prefill (after the round launched ahead, where one is: engine/decode_overlap.py),
each speculative request-round committing a draw (its request class's, or the drafter's own: draws.py);
an arm's tok/s and its (plan, batch) steps. policy=budget takes K_i from the engine's chooser (`RequestSpans`)."""

from __future__ import annotations

import bisect
import itertools
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TypeAlias

import numpy as np

from engine.bench.study.model import StepCosts, committed_pmf
from engine.kernels.span_meta import ragged_span
from engine.levers import Levers, gated
from engine.policy.choice import AdaptiveSpans
from engine.policy.costs import CostTable
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
    policy: SpanPolicy | RequestSpans | None = None,
    accepted: Accepted | None = None,
    classes: Sequence[Sequence[float]] = (),
) -> SimResult:
    """drafts None: plain decode; gate N gates rounds of >= N requests; buckets: a step of n requests
    runs the graphs of the first bucket >= n; draws: the request-rounds' accepted-draft counts in order
    (default: seeded from `conditional`, or from one of `classes` drawn per request); accepted: request
    i's draws by tokens output (draws.py); policy: the adaptive span policy (or the per-request one)
    choosing and observing each round as the engine's does."""
    if concurrency < 1 or requests < 1 or new_tokens < 1:
        raise ValueError(f"need concurrency, requests, new_tokens >= 1 (got {concurrency}, {requests}, {new_tokens})")
    draw = _request_drawer(classes or [conditional], seed, draws, accepted, new_tokens, requests)
    engine, each = "plain" if drafts is None else "spec", isinstance(policy, RequestSpans)  # each: K_i per request
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
            reqs = policy.stand_ins(ids, running) if each else []
            if drafts is None:
                plan = Plan.DECODE.value
            else:
                gate_on = gated(n, gate)
                if each and not gate_on:  # a row per request index: each starts from the pooled estimate
                    k = policy.choose(reqs, not waiting)
                elif policy is not None and not gate_on:  # nothing waiting: the wave's remaining tokens, as the engine
                    k = policy.decide(n, drafts, None if waiting else list(running), max(running) - 1)
                ks, k = (k, max(k)) if isinstance(k, list) else ([k] * n, k)
                plan = Plan.GATED.value if gate_on or k == 0 else Plan.SPECULATIVE.value
            res.steps.append((plan, n))
            spec, m = plan == Plan.SPECULATIVE.value, next((b for b in sorted(buckets) if b >= n), n)
            ms = policy.ms(costs, n, m, ks, bool(buckets)) if each and spec else costs.step_ms(plan, n, m, k)
            res.ms += ms
            if policy is not None and drafts is not None and not each:
                policy.observe_wall(n, 0 if plan == Plan.GATED.value else k, ms)
            if spec:
                limits = [min(ki, left - 1) for ki, left in zip(ks, running, strict=True)]
                ahead = max(left - 1 - lim for left, lim in zip(running, limits, strict=True)) > drafts
                if each:  # as the engine: launched ahead where a uniform K is planned now
                    policy.launched(reqs, not waiting, limits)
                    ahead = ks.count(k) == n and policy.next_k(reqs, not waiting) > 0
                held = not admitting and (policy is None or ahead) and any(left >= k + 2 for left in running)
                got = [min(draw(i, left, ki), lim) for i, left, ki, lim in zip(ids, running, ks, limits, strict=True)]
                if each:
                    policy.settled(k, reqs, limits, got)
                elif policy is not None:
                    policy.observe(limits, got)
                commits = [1 + a for a in got]
            else:
                commits = [1] * n
                if each:
                    if not gate_on:  # a gated round it chose: it plans the next one now (engine/round.py)
                        policy.launched(reqs, not waiting, None)
                    policy.settled(0, reqs)
                elif policy is not None and drafts is not None:
                    policy.gated()
            if each:  # as the engine: the round settled, then its step's wall
                policy.wall(n, ms)
            res.tokens += sum(commits)
            running = [left - k for left, k in zip(running, commits, strict=True)]
            held = plan == Plan.SPECULATIVE.value and held and any(left > 0 for left in running)
        ids = [i for i, left in zip(ids, running, strict=True) if left > 0]
        running = [left for left in running if left > 0]
    return res


def _request_drawer(
    rates: Sequence[Sequence[float]], seed: int, draws, accepted: Accepted | None, new_tokens: int, requests: int
) -> Callable[[int, int, int], int]:
    """draw(request index, tokens left, k): the accepted-draft count of one request-round of k drafts;
    seeded, request i's class (one of `rates`) drawn from a second generator (one class: none drawn)."""
    if accepted is not None:
        return lambda i, left, k: min(accepted(i, new_tokens - left), k)
    if draws is not None:
        return lambda _i, _left, _k: next(draws)
    rng, pick, cdfs = random.Random(seed), random.Random(seed + (1 << 32)), {}
    cls = [pick.randrange(len(rates)) for _ in range(requests)] if len(rates) > 1 else [0] * requests

    def draw(i: int, _left: int, k: int) -> int:
        if (cls[i], k) not in cdfs:
            cdfs[cls[i], k] = list(itertools.accumulate(committed_pmf(rates[cls[i]], k)))
        cdf = cdfs[cls[i], k]
        return min(bisect.bisect_right(cdf, rng.random()), len(cdf) - 1)

    return draw


class RequestSpans(AdaptiveSpans):
    """policy=budget in the replay: the engine's own per-request chooser (engine/policy/choice.py) over
    stand-in requests (a row of estimates per request index), its estimate from `conditional`, each round settled and
    timed as engine/round.py does; `ms`: a round of K_i on the table as the engine runs it (ragged rows at
    the request bucket times the least ragged span holding them; eager: the rows, linear in span)."""

    def __init__(self, table: CostTable, per_round: int, conditional: Sequence[float], max_drafts: int = 0, gate=0):
        super().__init__(SpanPolicy(table, per_round))
        self.policy.conditional = list(conditional)
        self.configure(Levers(max_batch=gate, max_drafts=max_drafts, policy="budget"))
        self._stand: dict[int, SimpleNamespace] = {}

    def stand_ins(self, ids: Sequence[int], running: Sequence[int]) -> list[SimpleNamespace]:
        """The running requests as the chooser reads them, one object a request index (a plan holds for
        them, as for the engine's requests): a row per index, tokens left, no context."""
        for i, r in zip(ids, running, strict=True):
            self._stand.setdefault(i, SimpleNamespace(index=i, slot=i, num_kv=0)).remaining = r
        return [self._stand[i] for i in ids]

    def ms(self, costs: StepCosts, n: int, m: int, ks: list[int], graphs: bool) -> float:
        k, rows, ragged, (t, p) = max(ks), n + sum(ks), min(ks) != max(ks), (self.policy.table, self.policy.per_round)
        span = ragged_span(p, m, rows) if graphs and ragged else rows / n
        verify = np.interp(span, t.spans(), [t.verify_ms(m, s) for s in t.spans()])
        return t.draft_ms(m, k) + float(verify) + costs.host_ms(Plan.SPECULATIVE.value, n, k)
