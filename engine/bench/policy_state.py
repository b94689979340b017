"""What the adaptive policy did in one bench run, read off its engine for the sweep's row (empty under
the static policy): K per round, its probes, its host terms and the residuals it learnt them from."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from engine.engine import Engine


def policy_counts(engine: Engine) -> tuple[Counter, Counter]:
    """The adaptive policy's rounds per K decided and probe rounds per (batch, K) so far."""
    policy = engine.rounds.policy
    return (Counter(policy.chosen), Counter(policy.probed)) if policy else (Counter(), Counter())


def _kind(spec: bool, bucket: int) -> str:
    return f"{'spec' if spec else 'gated'}@{bucket}"


def policy_host(engine: Engine) -> str:
    """The learnt host terms, ms per kind and batch bucket ("spec@16:2.100 gated@16:0.390")."""
    policy = engine.rounds.policy
    terms = sorted(policy.host.ms.items()) if policy else []
    return " ".join(f"{_kind(*key)}:{ms:.3f}" for key, ms in terms)


@contextmanager
def host_residuals(engine: Engine) -> Iterator[list[tuple[bool, int, float]]]:
    """The (speculative, bucket, residual ms) of every wall the policy's host term takes while inside."""
    policy = engine.rounds.policy
    walls: list[tuple[bool, int, float]] = []
    if policy is None:
        yield walls
        return
    policy.host.log = walls
    try:
        yield walls
    finally:
        policy.host.log = None


def residual_summary(walls: list[tuple[bool, int, float]]) -> str:
    """Per kind and bucket "spec@64:n:p50:p90:max" (ms) of the walls taken."""
    by: dict[tuple[bool, int], list[float]] = {}
    for spec, bucket, ms in walls:
        by.setdefault((spec, bucket), []).append(ms)
    items = []
    for (spec, bucket), values in sorted(by.items()):
        p90 = statistics.quantiles(values, n=10, method="inclusive")[-1] if len(values) > 1 else values[0]
        stats = f"{len(values)}:{statistics.median(values):.3f}:{p90:.3f}:{max(values):.3f}"
        items.append(f"{_kind(spec, bucket)}:{stats}")
    return " ".join(items)
