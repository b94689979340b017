"""Every CUDA graph the sweep can replay, captured before it (the benchmarks README, "study");
`CaptureLog` counts each arm-run's captures (`graph_captures`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import torch

from engine.bench.arms import Arm, arm_drafts
from engine.engine import Engine
from engine.kernels.span_meta import ragged_spans
from engine.policy.span import policy_spans
from engine.policy.warmup import dummy_requests, warm_graphs

log = logging.getLogger(__name__)

FREE_GIB = 8.0  # stop capturing with less device memory free than this (the sweep captures the rest)


def graph_keys(arms: Sequence[Arm], per_round: int) -> tuple[list[int], bool, list[int]]:
    """(the drafts K of every uniform speculative round an arm can run, whether any runs one-token rounds:
    a gate, or a policy's K = 0, the ragged verify spans of policy=budget: as the engine's warm-up)."""
    ks, ragged, spans, one_token = set(), set(), ragged_spans(per_round), False
    for arm in arms:
        if arm.is_plain:
            continue
        k = arm_drafts(arm, per_round)
        ks |= {s - 1 for s in policy_spans(per_round) if 0 < s - 1 <= k} if arm.adaptive else {k}
        ks |= set(range(1, k + 1)) if arm.per_request else set()
        ragged |= {s for s in spans if s <= min(s for s in spans if s > k)} if arm.per_request else set()
        one_token |= bool(arm.gate) or arm.adaptive
    return sorted(ks), one_token, sorted(ragged)


def capture_graphs(
    engine: Engine, ks: Sequence[int], one_token: bool, batches: Sequence[int], context: int, budget_s, ragged=()
) -> int:
    """The graphs captured by warming (engine/policy/warmup.py) the one-token step (one_token), the
    drafter and the verify of each K and each ragged span at each batch on dummy requests of `context`
    tokens, up to the time budget or the memory floor."""
    runner = engine.runner
    if not runner.graphs.enabled or not batches:
        return 0
    start = time.perf_counter()

    def stop(batch: int) -> bool:
        if _stop(engine.device, start, budget_s):
            log.warning("graph capture stopped before batch %d: the sweep captures the rest", batch)
            return True
        return False

    with dummy_requests(engine, max(batches), context, max([0, *ks, *ragged]) + 1) as reqs:
        return warm_graphs(runner, engine.rounds.accept, reqs, batches, ks, one_token, stop, ragged)


def _stop(device: torch.device, start: float, budget_s: float | None) -> bool:
    if budget_s is not None and time.perf_counter() - start > budget_s:
        return True
    return device.type == "cuda" and torch.cuda.mem_get_info(device)[0] < FREE_GIB * 2**30


class CaptureLog:
    """A sweep's before_arm hook that counts the graphs the engines captured in each arm-run."""

    def __init__(self, engines: dict[str, Engine], inner: Callable[[Arm], None] | None = None):
        self.engines, self.inner, self.marks = engines, inner, []

    def _total(self) -> int:
        return sum(e.runner.graphs.captures for e in self.engines.values())

    def before_arm(self, arm: Arm) -> None:
        self.marks.append(self._total())
        if self.inner:
            self.inner(arm)

    def runs(self) -> list[int]:
        """Graphs captured by each arm-run so far, in order (the last one's up to now)."""
        marks = [*self.marks, self._total()]
        return [b - a for a, b in zip(marks, marks[1:], strict=False)]


def tag_rows(rows: list[dict], captures: list[int], warmup_runs: int) -> None:
    """Each measured row's graph_captures: the runs after the warm-up round's, in the sweep's order."""
    measured = captures[warmup_runs:]
    if len(measured) != len(rows):
        log.warning("graph captures: %d measured runs for %d rows; not tagged", len(measured), len(rows))
        return
    for row, n in zip(rows, measured, strict=True):
        row["graph_captures"] = n


def graph_stage(engine: Engine, arms: Sequence[Arm], per_round: int, batches: Sequence[int], context: int, budget_s):
    """capture_graphs for the study's arms at these buckets (a failure is logged: the sweep captures on
    first use)."""
    ks, one_token, ragged = graph_keys(arms, per_round)
    t0 = time.perf_counter()
    try:
        n = capture_graphs(engine, ks, one_token, batches, context, budget_s, ragged)
    except Exception:
        log.exception("graph capture failed: the sweep captures its graphs on first use")
        return 0
    took = time.perf_counter() - t0
    log.info("captured %d graphs (K %s, one-token %s, %d batches) in %.1f s", n, ks, one_token, len(batches), took)
    return n
