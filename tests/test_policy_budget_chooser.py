"""The threshold chooser (engine/policy/budget.py `budget_spans`) against the sorting chooser it replaced
(kept here as the reference: a stable argsort of every slot, position-major): the same K_i and device ms
on random cost arrays and survival, with ties, caps of 0, a gated batch and equal estimates. The
estimator (`RequestAcceptance`) against the row-per-request update it replaced: the same bits."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from engine.kernels.span_meta import ragged_spans
from engine.policy import budget
from engine.policy.budget import REQUEST_EMA, REQUEST_RELAX, RequestAcceptance, budget_spans
from engine.policy.span import SPEC_DISCOUNT


def reference(survival, caps, spans, verify, draft, base, as_run, host=(0.0, 0.0)) -> tuple[list[int], float]:
    n, p = survival.shape
    if n == 0:
        return [0] * n, float(verify[0])
    cap = np.minimum(np.asarray(caps, dtype=np.int64), int(spans[-1]) - 1)
    masked = np.where(np.arange(p)[None, :] < cap[:, None], survival, -1.0)
    order = np.argsort(-masked.T.reshape(-1), kind="stable")[: int(cap.sum())]
    if order.size == 0:
        return [0] * n, float(verify[0])
    b = np.arange(order.size + 1)
    committed = n + np.concatenate(([0.0], np.cumsum(masked.T.reshape(-1)[order])))
    heads = np.concatenate(([0], np.maximum.accumulate(order // n + 1)))
    device = draft[heads] + as_run[b]  # as_run: the verify of n + B rows as the round runs them
    device[0] = verify[0]
    value = committed / (device + np.where(b > 0, host[1], host[0])) / np.where(b > 0, 1.0 + SPEC_DISCOUNT, 1.0)
    best = int(np.argmax(value))
    return np.bincount(order[:best] % n, minlength=n).tolist(), float(device[best])


def costs(rng, n: int, p: int, graphs: bool = False) -> tuple:
    """Measured spans 1..widest, verify rising in rows, drafter ms rising in heads; the verify of n + B
    rows for B in 0..n*p, exact and as run: eager (the exact rows) or under graphs (the least ragged span
    holding the rows), by a loop over B."""
    widest = int(rng.integers(2, p + 3))
    spans = np.array(sorted({1, widest, *rng.integers(1, widest + 1, size=3).tolist()}), dtype=np.float64)
    per_slot, base = rng.uniform(0.001, 1.0) * rng.choice([1.0, 0.1, 0.01]), rng.uniform(1.0, 20.0)
    verify = base + per_slot * n * (spans - 1) * rng.uniform(0.8, 1.2, size=spans.size)
    verify = np.maximum.accumulate(verify)
    draft = rng.uniform(0.1, 5.0) + np.cumsum(rng.uniform(0.0, 0.3, size=p + 1)) * rng.choice([0.0, 1.0])
    exact = np.interp(1.0 + np.arange(n * p + 1) / n, spans, verify)
    if not graphs:
        return spans, verify, draft, exact, exact
    padded = [1.0] + [min(s for s in ragged_spans(p) if s * n >= n + b) for b in range(1, n * p + 1)]
    return spans, verify, draft, exact, np.interp(padded, spans, verify)


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
    rng, graphs = np.random.default_rng(seed), np.random.default_rng(1000 + seed)  # eager or under graphs
    mixed = mixed_padded = 0
    for _ in range(250):
        n, p = int(rng.choice([1, 2, 3, 7, 16, 64, 256])), int(rng.integers(1, 16))
        s, c = survival(rng, n, p), costs(rng, n, p, graphs.random() < 0.5)
        caps = rng.integers(0, p + 1, size=n) if rng.random() < 0.5 else np.full(n, p)
        if rng.random() < 0.1:
            caps[:] = 0
        host = (rng.uniform(0, 2), rng.uniform(0, 4)) if rng.random() < 0.5 else (0.0, 0.0)
        want = reference(s, caps, *c, host)
        mixed_padded += len(set(want[0])) > 1 and c[3] is not c[4]
        if rng.random() < 0.5:  # the estimator's layout: the transpose of a C-contiguous [P, N]
            s = np.ascontiguousarray(s.T).T
        got = budget_spans(None, s, caps, host=host, costs=c)
        assert got == want, (seed, n, p)
        mixed += len(set(got[0])) > 1
    assert mixed > 10 and mixed_padded > 3  # the draws reach mixed K_i, eager and under graphs


def test_equal_estimates_and_all_ones_tie_alike():
    rng = np.random.default_rng(99)
    for n in (1, 5, 64, 256):
        c = costs(rng, n, 15, graphs=n > 1)
        for s in (np.ones((n, 15)), np.tile(np.cumprod(np.full(15, 0.8)), (n, 1))):
            caps = np.full(n, 15)
            assert budget_spans(None, s, caps, costs=c) == reference(s, caps, *c)


@pytest.mark.parametrize("seed", range(6))
def test_the_proofs_that_skip_work_match_the_sorting_chooser(seed, monkeypatch):
    """With the memo span_costs appends (the B last taken): 0 tries to prove the round gated without
    sorting, else B is searched up to past it, the rest proven short. Whatever the memo holds (near the
    answer, 0, anywhere; the caps given or a function of them), the same K_i and device ms as the
    reference, the memo at the B taken where one was searched, the caps unread in a round proven gated,
    and both proofs seen to pass and to fail on these draws."""
    proofs = []
    short = budget._short
    monkeypatch.setattr(budget, "_short", lambda *a: proofs.append((a[2] > 0, short(*a))) or proofs[-1][1])
    rng, graphs = np.random.default_rng(100 + seed), np.random.default_rng(1100 + seed)
    for _ in range(200):
        n, p = int(rng.choice([1, 7, 64, 256, 256])), int(rng.integers(1, 16))
        s, c = survival(rng, n, p), costs(rng, n, p, graphs.random() < 0.5)
        caps = rng.integers(0, p + 1, size=n) if rng.random() < 0.3 else np.full(n, p)
        host = (rng.uniform(0, 2), rng.uniform(0, 4)) if rng.random() < 0.5 else (0.0, 0.0)
        want = reference(s, caps, *c, host)
        near = sum(want[0]) + int(rng.integers(-n, n + 1))
        memo = [max(int(rng.choice([near, near, 0, rng.integers(0, n * p + 1)])), 0)]
        last, calls, seen = memo[0], [], len(proofs)
        given = (lambda c=calls, k=caps: c.append(1) or k) if rng.random() < 0.5 else caps  # read only if needed
        assert budget_spans(None, np.ascontiguousarray(s.T).T, given, host=host, costs=(*c, memo)) == want
        assert memo[0] in (sum(want[0]), last)  # kept where no B was searched (no slot, or proven gated)
        assert not (calls and (False, True) in proofs[seen:])  # a round proven gated never reads its caps
    assert {(False, True), (False, False), (True, True), (True, False)} <= set(proofs)


class ReferenceAcceptance:
    """The estimator as first written: a row per slot, every position's step from where(tried, ...)."""

    def __init__(self, per_round: int):
        self.per_round, self.rows, self.owner = per_round, np.ones((0, per_round)), np.zeros(0, dtype=np.int64)

    def slots(self, reqs, pooled) -> np.ndarray:
        slots, index = np.array([r.slot for r in reqs], dtype=np.int64), np.array([r.index for r in reqs])
        if slots.size and slots.max() >= len(self.owner):
            grow = int(slots.max()) + 1 - len(self.owner)
            self.rows = np.vstack([self.rows, np.ones((grow, self.per_round))])
            self.owner = np.concatenate([self.owner, np.full(grow, -1)])
        fresh = self.owner[slots] != index
        self.rows[slots[fresh]] = np.asarray(pooled, dtype=np.float64)
        self.owner[slots] = index
        return slots

    def observe(self, slots, limits, accepted, pooled) -> tuple[list[int], list[int]]:
        j, n = np.arange(self.per_round)[None, :], np.asarray(accepted, dtype=np.int64)[:, None]
        tried = j < np.minimum(n + 1, np.asarray(limits, dtype=np.int64)[:, None])
        rows = self.rows[slots]
        step = np.where(tried, REQUEST_EMA * ((j < n) - rows), REQUEST_RELAX * (np.asarray(pooled)[None, :] - rows))
        self.rows[slots] = rows + step
        return tried.sum(0).tolist(), (tried & (j < n)).sum(0).tolist()


@pytest.mark.parametrize("seed", range(4))
def test_the_estimator_matches_the_row_per_request_update(seed):
    """Batches drawn from 40 slots and a stream of request indices (a slot's new owner starts from the
    pool), limits 0..P+1 (gated rounds: all 0), accepted 0..limit, a moving
    pool: the same rows, counts and survival, bit for bit; the same requests twice reuse the slots."""
    rng = np.random.default_rng(seed)
    p = int(rng.integers(1, 16))
    got, want = RequestAcceptance(p), ReferenceAcceptance(p)
    owners = {}  # slot -> request index
    reqs = []
    for _ in range(300):
        if not reqs or rng.random() < 0.3:  # a new batch: some slots change hands
            for slot in rng.choice(40, size=int(rng.integers(1, 41)), replace=False).tolist():
                if slot not in owners or rng.random() < 0.2:
                    owners[slot] = len(owners) + 1000 * seed + int(rng.integers(1 << 20))
            chosen = rng.choice(sorted(owners), size=int(rng.integers(1, len(owners) + 1)), replace=False)
            reqs = [SimpleNamespace(slot=int(s), index=owners[int(s)]) for s in chosen]
        pooled = rng.uniform(0.0, 1.0, size=p).tolist()
        slots = got.slots(reqs, pooled)
        assert slots.tolist() == want.slots(reqs, pooled).tolist()
        assert got.slots(reqs, pooled) is slots  # the same requests in the same slots: the last answer
        survival = got.survival(slots)
        assert np.array_equal(survival, np.cumprod(want.rows[slots], axis=1))
        limits = [0] * len(reqs) if rng.random() < 0.2 else rng.integers(0, p + 2, size=len(reqs)).tolist()
        accepted = [int(rng.integers(0, lim + 1)) for lim in limits]
        assert got.observe(slots, limits, accepted, pooled) == want.observe(slots, limits, accepted, pooled)
        assert np.array_equal(got.cols.T, want.rows)


@pytest.mark.parametrize("seed", range(4))
def test_the_held_batch_columns_match_the_row_per_request_update(seed):
    """The last observed batch's columns are held apart (no scatter, no gather) until another batch or a
    read of `cols`: rounds that read survival and observe on the held columns, the rows read only now and
    then, batches that come back after others and slots that change hands: the same bits throughout."""
    rng = np.random.default_rng(50 + seed)
    p = int(rng.integers(1, 16))
    got, want = RequestAcceptance(p), ReferenceAcceptance(p)
    owners, reqs, batches, pool = {}, [], [], 40 if seed % 2 else 300  # wide batches: survival in place
    for _ in range(300):
        if not reqs or rng.random() < 0.15:  # another batch: a new one, or one seen before
            if batches and rng.random() < 0.4:
                reqs = batches[int(rng.integers(len(batches)))]
            else:
                for slot in rng.choice(pool, size=int(rng.integers(1, pool + 1)), replace=False).tolist():
                    if slot not in owners or rng.random() < 0.2:
                        owners[slot] = len(owners) + 1000 * seed + int(rng.integers(1 << 20))
                chosen = rng.choice(sorted(owners), size=int(rng.integers(1, len(owners) + 1)), replace=False)
                reqs = [SimpleNamespace(slot=int(s), index=owners[int(s)]) for s in chosen]
                batches.append(reqs)
        pooled = rng.uniform(0.0, 1.0, size=p).tolist()
        slots = got.slots(reqs, pooled)
        assert slots.tolist() == want.slots(reqs, pooled).tolist()
        assert np.array_equal(got.survival(slots), np.cumprod(want.rows[slots], axis=1))
        limits = [0] * len(reqs) if rng.random() < 0.2 else rng.integers(0, p + 2, size=len(reqs)).tolist()
        accepted = [int(rng.integers(0, lim + 1)) for lim in limits]
        assert got.observe(slots, limits, accepted, pooled) == want.observe(slots, limits, accepted, pooled)
        if rng.random() < 0.1:
            assert np.array_equal(got.cols.T, want.rows)
    assert np.array_equal(got.cols.T, want.rows)
