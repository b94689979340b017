"""Offline closed-loop load: c request slots, a new request admitted as soon as one finishes, until a
fixed number of requests has completed; greedy, EOS ignored. And what a run's steps add up to."""

from __future__ import annotations

import copy
import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import zip_longest

from engine.bench.gcstate import GcWatch, settle_heap
from engine.bench.hw import peak_memory_gib, reset_peak_memory
from engine.config import SamplingParams
from engine.engine import Engine, SpecStats
from engine.scheduler import Plan
from engine.timing import PhaseTimer, StepTiming, sync


@dataclass
class LoadResult:
    wall_s: float
    requests: int
    output_tokens: int
    max_in_flight: int
    steps: list[StepTiming] = field(default_factory=list)
    stats: SpecStats = field(default_factory=SpecStats)  # this run's delta
    peak_mem_gib: float | None = None
    gc_ms: float = 0.0  # in cyclic-GC collections during the run (part of wall_s)
    gc_full: int = 0  # of them, full (generation 2) collections

    @property
    def tok_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0


def closed_loop(
    engine: Engine,
    prompts: Sequence[Sequence[int]],
    concurrency: int,
    num_requests: int,
    max_tokens: int | Sequence[int],
    first: int = 0,
) -> LoadResult:
    """Keep `concurrency` requests in flight until `num_requests` have finished (request i: prompt
    (first + i) % len, max_tokens[i] for a sequence); the wall includes the prefills, from a settled heap;
    `Engine.no_more_requests` is set once the last request is in."""
    if concurrency < 1 or num_requests < 1 or not prompts:
        raise ValueError(
            f"closed_loop needs concurrency >= 1, requests >= 1 and prompts (got {concurrency}, "
            f"{num_requests}, {len(prompts)} prompts)"
        )
    if engine.has_unfinished():
        raise RuntimeError("closed_loop needs an idle engine")
    lengths = [max_tokens] if isinstance(max_tokens, int) else list(max_tokens)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths]
    if engine.timer is None:
        engine.timer = PhaseTimer(engine.device)
    first_step = len(engine.timer.records)
    before = copy.deepcopy(engine.stats)
    reset_peak_memory(engine.device)
    settle_heap()
    sync(engine.device)

    submitted = done = tokens = in_flight = max_in_flight = 0

    def submit() -> None:
        nonlocal submitted, in_flight, max_in_flight
        i = first + submitted
        engine.add_request(list(prompts[i % len(prompts)]), params[i % len(params)])
        submitted += 1
        in_flight += 1
        max_in_flight = max(max_in_flight, in_flight)
        engine.no_more_requests = submitted == num_requests  # the last wave: it only drains

    with GcWatch() as watch:
        t0 = time.perf_counter()
        try:
            while submitted < min(concurrency, num_requests):
                submit()
            while done < num_requests:
                if not engine.has_unfinished():
                    raise RuntimeError(f"engine idle with {num_requests - done} requests unaccounted for")
                for out in engine.step():
                    tokens += len(out.new_token_ids)
                    if not out.finished:
                        continue
                    if out.finish_reason == "rejected":
                        raise RuntimeError(f"{out.request_id} rejected: {out.error}")
                    done += 1
                    in_flight -= 1
                    if submitted < num_requests:
                        submit()
        finally:
            engine.no_more_requests = False
        sync(engine.device)
        wall = time.perf_counter() - t0
    result = LoadResult(wall, done, tokens, max_in_flight, engine.timer.records[first_step:])
    result.stats, result.peak_mem_gib = stats_delta(before, engine.stats), peak_memory_gib(engine.device)
    result.gc_ms, result.gc_full = watch.total_ms, watch.count[2]
    return result


def output_lengths(n: int, mean: int, spread: float, seed: int = 0) -> list[int]:
    """Per prompt index, an output length uniform in mean x [1 - spread, 1 + spread], seeded: every arm
    gets the same length for the same prompt."""
    if not 0.0 <= spread < 1.0 or mean < 1:
        raise ValueError(f"output lengths: spread {spread} must be in [0, 1) and mean {mean} >= 1")
    rng = random.Random(seed)
    return [max(1, round(mean * (1 + spread * (2 * rng.random() - 1)))) for _ in range(n)]


def stats_delta(before: SpecStats, after: SpecStats) -> SpecStats:
    by_pos = [a - b for a, b in zip_longest(after.accepted_by_position, before.accepted_by_position, fillvalue=0)]
    counts = ("rounds", "gated_rounds", "draft_forwards", "drafts", "committed_tokens")
    counts += ("draft_tokens_verified", "draft_tokens_accepted")
    return SpecStats(**{k: getattr(after, k) - getattr(before, k) for k in counts}, accepted_by_position=by_pos)


def acceptance_histogram(stats: SpecStats) -> list[int]:
    """hist[n] = speculating request-rounds that accepted exactly n drafts (from accepted_by_position)."""
    by_pos = list(stats.accepted_by_position)
    if stats.drafts == 0:
        return [0] * (len(by_pos) + 1)
    more_than = [stats.drafts, *by_pos, 0]
    return [more_than[n] - more_than[n + 1] for n in range(len(by_pos) + 1)]


def phase_split(steps: Sequence[StepTiming]) -> dict[str, float]:
    """Summed ms per phase: draft, target (the verify/decode forwards), other (the rest, prefill steps
    included), prefill (the prefill steps' wall) and steps (all)."""
    draft = sum(s.phases.get("draft", 0.0) for s in steps)
    target = sum(s.phases.get("target", 0.0) for s in steps)
    total = sum(s.total for s in steps)
    prefill = sum(s.total for s in steps if s.plan == Plan.PREFILL.value)
    other = max(0.0, total - draft - target)
    return {"draft_ms": draft, "target_ms": target, "other_ms": other, "prefill_ms": prefill, "steps_ms": total}


def mean_batch(steps: Sequence[StepTiming]) -> float | None:
    """Requests per decode-side step (plain, speculative or gated): how full the batch ran."""
    batches = [s.batch for s in steps if s.plan != Plan.PREFILL.value]
    return sum(batches) / len(batches) if batches else None


def plan_counts(steps: Sequence[StepTiming]) -> Counter[str]:
    return Counter(s.plan for s in steps)
