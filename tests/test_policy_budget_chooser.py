"""The threshold chooser (engine/policy/budget.py `budget_spans`) against the sorting chooser it replaced
(kept here as the reference: a stable argsort of every slot, position-major): the same K_i and device ms
on random cost arrays and survival, with ties, caps of 0, a gated batch and equal estimates."""

from __future__ import annotations

import numpy as np
import pytest

from engine.levers import gated
from engine.policy.budget import budget_spans
from engine.policy.span import SPEC_DISCOUNT


def reference(survival, caps, spans, verify, draft, host=(0.0, 0.0), max_batch=0) -> tuple[list[int], float]:
    n, p = survival.shape
    if gated(n, max_batch) or n == 0:
        return [0] * n, float(verify[0])
    cap = np.minimum(np.asarray(caps, dtype=np.int64), int(spans[-1]) - 1)
    masked = np.where(np.arange(p)[None, :] < cap[:, None], survival, -1.0)
    order = np.argsort(-masked.T.reshape(-1), kind="stable")[: int(cap.sum())]
    if order.size == 0:
        return [0] * n, float(verify[0])
    b = np.arange(order.size + 1)
    committed = n + np.concatenate(([0.0], np.cumsum(masked.T.reshape(-1)[order])))
    heads = np.concatenate(([0], np.maximum.accumulate(order // n + 1)))
    device = draft[heads] + np.interp(1.0 + b / n, spans, verify)
    device[0] = verify[0]
    value = committed / (device + np.where(b > 0, host[1], host[0])) / np.where(b > 0, 1.0 + SPEC_DISCOUNT, 1.0)
    best = int(np.argmax(value))
    return np.bincount(order[:best] % n, minlength=n).tolist(), float(device[best])


def costs(rng, n: int, p: int) -> tuple:
    """Measured spans 1..widest, verify rising in rows, drafter ms rising in heads; the verify row for
    B in 0..n*p as span_costs gives it."""
    widest = int(rng.integers(2, p + 3))
    spans = np.array(sorted({1, widest, *rng.integers(1, widest + 1, size=3).tolist()}), dtype=np.float64)
    per_slot, base = rng.uniform(0.001, 1.0) * rng.choice([1.0, 0.1, 0.01]), rng.uniform(1.0, 20.0)
    verify = base + per_slot * n * (spans - 1) * rng.uniform(0.8, 1.2, size=spans.size)
    verify = np.maximum.accumulate(verify)
    draft = rng.uniform(0.1, 5.0) + np.cumsum(rng.uniform(0.0, 0.3, size=p + 1)) * rng.choice([0.0, 1.0])
    return spans, verify, draft, np.interp(1.0 + np.arange(n * p + 1) / n, spans, verify)


def survival(rng, n: int, p: int) -> np.ndarray:
    kind = rng.integers(4)
    if kind == 0:  # continuous
        a = rng.uniform(0.0, 1.0, size=(n, p))
    elif kind == 1:  # few values: ties within and across requests, acceptance 1 (equal survival along a row)
        a = rng.choice([0.5, 0.75, 1.0], size=(n, p))
    elif kind == 2:  # equal estimates (a fresh batch seeded from the pool)
        a = np.tile(rng.uniform(0.3, 1.0, size=p), (n, 1))
    else:  # two classes of request
        rows = rng.uniform(0.2, 1.0, size=(2, p))
        a = rows[rng.integers(2, size=n)]
    if rng.random() < 0.1:
        a[:, rng.integers(p)] = 0.0
    return np.cumprod(a, axis=1)


@pytest.mark.parametrize("seed", range(8))
def test_the_threshold_chooser_matches_the_sorting_chooser(seed):
    rng = np.random.default_rng(seed)
    mixed = 0
    for _ in range(250):
        n, p = int(rng.choice([1, 2, 3, 7, 16, 64, 256])), int(rng.integers(1, 16))
        s, c = survival(rng, n, p), costs(rng, n, p)
        caps = rng.integers(0, p + 1, size=n) if rng.random() < 0.5 else np.full(n, p)
        if rng.random() < 0.1:
            caps[:] = 0
        host = (rng.uniform(0, 2), rng.uniform(0, 4)) if rng.random() < 0.5 else (0.0, 0.0)
        max_batch = int(rng.choice([0, 0, 0, n, n + 1]))
        want = reference(s, caps, *c[:3], host, max_batch)
        got = budget_spans(None, s, caps, host=host, max_batch=max_batch, costs=c)
        assert got == want, (seed, n, p)
        mixed += len(set(got[0])) > 1
    assert mixed > 10  # the draws reach mixed K_i, not only budgets of 0 or everything


def test_equal_estimates_and_all_ones_tie_alike():
    rng = np.random.default_rng(99)
    for n in (1, 5, 64, 256):
        c = costs(rng, n, 15)
        for s in (np.ones((n, 15)), np.tile(np.cumprod(np.full(15, 0.8)), (n, 1))):
            caps = np.full(n, 15)
            assert budget_spans(None, s, caps, costs=c) == reference(s, caps, *c[:3])
