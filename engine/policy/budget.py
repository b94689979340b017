"""Per-request spans under one verify budget (SPEC 10; `policy=budget`).

Request i keeps a_i[j], P(draft j+1 accepted | drafts 1..j accepted) (`RequestAcceptance`: an EMA of its
own rounds, weight REQUEST_EMA, seeded from the pooled estimate and relaxed toward it, REQUEST_RELAX a
round, at the positions a round did not try). Survival s_ij = prod_{l<=j} a_i[l]. A budget of B draft
slots takes the B largest s_ij (stably, so a request's slots in position order: s_ij falls with j);
K_i = request i's slots taken. The round's B is the argmax over 0..sum(cap_i) (ties: the smaller B) of

    value(B) = (N + sum of the top-B s) / (draft_ms(N, max K_i) + verify_ms(N + B rows) + host)

verify_ms(N + B rows) = the table's verify at batch N and span 1 + B / N, linear between its measured
spans; under CUDA graphs (`padded`) a ragged verify runs at N x S rows, S the least of `ragged_spans`
holding them, and B is valued at that span's verify (its proofs keep the exact rows: a lower bound); a
speculative B is discounted by SPEC_DISCOUNT like the uniform policy's K; B = 0 is the gated
round (span 1, no drafter). cap_i = min(MAX_DRAFTS or P, P, tokens left - 1, widest measured span - 1).
Equal estimates give a uniform K (the value is linear-fractional between multiples of N). MAX_BATCH
gates a round before any span is chosen (the scheduler's `decide_plan`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from engine.kernels.span_meta import ragged_spans
from engine.policy.costs import CostTable
from engine.policy.span import SPEC_DISCOUNT, round_drafts

REQUEST_EMA = 0.25  # a request-round's weight in its own estimate, per position tried
REQUEST_RELAX = 0.01  # per round, an untried position's step toward the pooled estimate (slow: a re-probe)


def request_caps(remaining: Sequence[int], per_round: int, max_drafts: int) -> np.ndarray:
    """[N] the most drafts each request may verify: MAX_DRAFTS (0: none), the drafter's P, its tokens
    left minus the bonus."""
    cap = round_drafts(per_round, max_drafts)
    if len(remaining) and min(remaining) > cap:  # none near its end: one Python pass, no conversion
        return np.full(len(remaining), cap)
    return np.clip(np.asarray(remaining, dtype=np.int64) - 1, 0, cap)


def span_costs(table: CostTable, batch: int, heads: int, context: float | None = None, padded: bool = False) -> tuple:
    """(measured spans, their verify ms, drafter ms per head count 0..heads, verify ms of batch + B rows
    for B in 0..batch * heads: exact, and as run (padded: B >= 1 at the least ragged span holding the
    rows), [the B `budget_spans` last searched out on these costs: where it looks first]) at `batch`
    (clamped into the table's range) and mean `context`."""
    spans = table.spans()
    at = table.clamp(batch, spans)
    verify = np.array([table.verify_ms(at, s, context) for s in spans])
    draft = np.array([table.draft_ms(at, h, context) for h in range(heads + 1)])
    spans, n, b = np.array(spans, dtype=np.float64), max(batch, 1), np.arange(batch * heads + 1)
    exact = run = np.interp(1.0 + b / n, spans, verify)
    if padded:  # `ragged_span` of n + B rows, over every B at once; B = 0 is the gated round's span 1
        ragged = np.array(ragged_spans(heads))
        run = np.interp(ragged[np.searchsorted(ragged * n, n + b)], spans, verify)
        run[0] = exact[0]
    return spans, verify, draft, exact, run, [0]


def _short(a: float, slope: float, lo: int, end: int, n: int, base: np.ndarray, floor: float, value: float) -> bool:
    """Whether every B in (lo, end] is worth less than `value`, N + its top-B s being at most a + B slope (a
    proof): B's ms is at least floor (the least drafter ms, plus host) + base[B], linear between multiples of
    N (checked there and at the ends); 1e-7 of the value spares the rounding."""
    k, q, last = value * (1.0 + SPEC_DISCOUNT) * (1.0 - 1e-7), lo // n + 1, end // n
    kinks = (base[q * n : last * n + 1 : n] * k - np.arange(q * n, last * n + 1, n) * slope).min(initial=np.inf)
    return bool(min(kinks, k * base[lo + 1] - (lo + 1) * slope, k * base[end] - end * slope) > a - k * floor)


def budget_spans(
    table: CostTable,
    survival: np.ndarray,
    caps: Sequence[int] | Callable[[], Sequence[int]],
    context: float | None = None,
    host: tuple[float, float] = (0.0, 0.0),
    costs: tuple | None = None,
) -> tuple[list[int], float]:
    """(K_i per request, the round's device ms on the table) from survival [N, P] (s_ij, non-increasing
    in j; fastest as the transpose of a C-contiguous [P, N], as `RequestAcceptance.survival` gives it),
    caps [N] (or a function giving them, not called where the round is proven gated), host (gated,
    speculative) ms a round costs beyond the table; costs: `span_costs` of this batch, if cached. The
    top-B slots are a threshold on s: the B-th value of the sorted slots, the ties at it taken
    position-major; B's drafter heads step where each position's best slot enters. The answer is the
    argmax's; its work is less where the costs' memo holds the last B: 0, a proof of a gated round without
    sorting is tried first; else B is valued up to a little past it, the rest proven short."""
    n, p = survival.shape
    spans, verify, draft, base, as_run, *memo = costs or span_costs(table, n, p, context)
    last = memo[0] if memo else [0]  # the B last taken: 0, try to prove the round gated; else look near it
    gated_value, size, floor = n / (verify[0] + host[0]), n * p, lambda: float(draft[: p + 1].min()) + host[1]
    if not size:
        return [0] * n, float(verify[0])
    if not last[0]:  # without caps or sorting: for any tau, the top-B s sum to at most sum (s - tau)+ + B tau
        tau = max(gated_value * (1.0 + SPEC_DISCOUNT) * (base[-1] - base[0]) / size, 0.0)  # a slot's mean price
        if _short(n + float(np.maximum(survival, tau).sum()) - size * tau, tau, 0, size, n, base, floor(), gated_value):
            return [0] * n, float(verify[0])
    cap = np.minimum(caps() if callable(caps) else caps, int(spans[-1]) - 1)
    if (total := int(cap.sum())) == 0:
        return [0] * n, float(verify[0])
    slots = survival.T if total == size else np.where(np.arange(p)[:, None] < cap, survival.T, -1.0)  # [P, N]
    asc = np.sort(slots, axis=None)
    best_of = slots.max(axis=1)  # each position's best slot enters after the slots >= it in columns < j
    below = asc.searchsorted(best_of)
    enter = np.empty(p + 2, dtype=np.int64)
    enter[0], enter[-1], enter[1:-1] = 0, total + 1, size - below
    tied = np.flatnonzero(asc.searchsorted(best_of, side="right") - below > 1)  # ties at a position's best
    if tied.size:  # it enters ahead of those in its column and in later ones of the same best (a run)
        eq, bests, run = (slots[tied] == best_of[tied, None]).sum(axis=1).tolist(), best_of.tolist(), 0
        for k, j in reversed(list(enumerate(tied.tolist()))):
            run = eq[k] + (run if j + 1 < p and bests[j + 1] == bests[j] else 0)
            enter[j + 1] -= run - 1
    near = last[0] + last[0] // 8 + n // 4  # B <= near, if B > near is proven short (its s are <= asc[-near - 1])
    for hi in (near if last[0] and near + 1024 < total else total, total):  # (a proof costs some 1024 slots' values)
        value, heads = np.empty(hi + 1), np.minimum(enter, hi + 1)
        value[0] = gated_value
        np.cumsum(asc[::-1][:hi], out=value[1:])
        value[1:] += n
        device = np.repeat(draft[: p + 1], heads[1:] - heads[:-1])
        device += as_run[: hi + 1]
        top = value[hi]
        value[1:] /= device[1:] + host[1] if host[1] else device[1:]
        value[1:] /= 1.0 + SPEC_DISCOUNT
        last[0] = best = int(value.argmax())
        if hi == total or _short(top - hi * (d := float(asc[-hi - 1])), d, hi, total, n, base, floor(), value[best]):
            break
    if best == 0:
        return [0] * n, float(verify[0])
    t = asc[-best]
    taken = slots >= t
    excess = size - int(asc.searchsorted(t)) - best
    if excess:  # the ties at t past the budget, the last position-major
        taken, tied = np.ascontiguousarray(taken), (slots == t).reshape(-1)
        taken.reshape(-1)[tied] = np.arange(int(tied.sum()))[::-1] >= excess
    return taken.sum(axis=0, dtype=np.uint8 if p < 256 else np.int64).tolist(), float(device[best])


class RequestAcceptance:
    """Per-request conditional acceptance, one row per block-table slot, owned by the request index that
    last used it (a new owner, or one re-admitted after a preemption, starts from the pooled estimate).
    Held position-major (`cols` [P, slots]); the last observed batch's columns are held apart (no scatter,
    no gather) until another batch or a read of `cols` writes them back."""

    def __init__(self, per_round: int, ema: float = REQUEST_EMA, relax: float = REQUEST_RELAX):
        self.per_round, self.ema, self.relax = per_round, ema, relax
        self._cols = np.ones((per_round, 0))
        self._held: tuple = (None, None)  # the slots array observe last took, their columns
        self.owner = np.zeros(0, dtype=np.int64)
        c, j = np.arange(2 * per_round + 1), np.arange(per_round)[:, None]  # a request-round's code: hit + tried
        tried, hit = j < (c + 1) // 2, j < c // 2
        self._codes = tried, hit, np.where(tried, ema, relax), np.vstack([tried, hit]).astype(np.int64)
        self._last: tuple[list, list[int], np.ndarray] = ([], [], np.zeros(0, dtype=np.int64))  # reqs, slots

    @property
    def cols(self) -> np.ndarray:
        (held, cols), self._held = self._held, (None, None)
        if held is not None:
            self._cols[:, held] = cols
        return self._cols

    def slots(self, reqs: Sequence, pooled: Sequence[float]) -> np.ndarray:
        """[N] the requests' rows; a request new to its row is seeded from `pooled`. The same requests
        (equal: a Request is itself only) in the same slots as the last call: its answer (the rows are theirs)."""
        listed = [r.slot for r in reqs]
        last_reqs, last_slots, last = self._last
        if listed == last_slots and reqs == last_reqs:
            return last
        slots, index = np.array(listed, dtype=np.int64), np.array([r.index for r in reqs], dtype=np.int64)
        if slots.size and slots.max() >= self.owner.size:
            grow = int(slots.max()) + 1 - self.owner.size
            self._cols = np.hstack([self.cols, np.ones((self.per_round, grow))])
            self.owner = np.concatenate([self.owner, np.full(grow, -1)])
        fresh = self.owner[slots] != index
        if fresh.any():
            self.cols[:, slots[fresh]] = np.asarray(pooled, dtype=np.float64)[:, None]
            self.owner[slots] = index
        self._last = (list(reqs), listed, slots)
        return slots

    def survival(self, slots: np.ndarray) -> np.ndarray:
        """[N, P] s_ij: P(request i's draft j+1 is accepted), i over `slots` (the transpose of a [P, N])."""
        s = self._held[1] if self._held[0] is slots else self.cols.take(slots, axis=1)
        if len(slots) < 128:  # one call per position pays only on wide batches
            return np.cumprod(s, axis=0).T
        s = s.copy() if s is self._held[1] else s  # the held columns stay
        for j in range(1, self.per_round):
            np.multiply(s[j - 1], s[j], out=s[j])
        return s.T

    def observe(
        self, slots: np.ndarray, limits: Sequence[int], accepted: Sequence[int], pooled: Sequence[float]
    ) -> tuple[list[int], list[int]]:
        """A round's outcome per request (its draft limit, its accepted drafts; all 0 in a gated round).
        Position j was tried when j < limit and drafts 1..j were accepted: it moves `ema` toward 1 or 0,
        an untried one `relax` toward `pooled`. Returns the request-rounds that tried and accepted each
        position (the pooled estimate's update)."""
        p, cols = self.per_round, self._held[1] if self._held[0] is slots else self.cols.take(slots, axis=1)
        if not any(limits):  # a gated round: every position relaxes, none is counted
            self._held = (slots, cols + (np.asarray(pooled, dtype=np.float64)[:, None] - cols) * self.relax)
            return [0] * p, [0] * p
        n = np.fromiter(accepted, np.int64, len(slots))
        m = np.minimum(n + 1, np.fromiter(limits, np.int64, len(slots)))  # positions tried; hit: min(n, m)
        code = np.minimum(n, m)
        code += m
        np.minimum(code, 2 * p, out=code)
        tried, hit, weight, count = self._codes
        goal = np.where(tried, hit, np.asarray(pooled, dtype=np.float64)[:, None]).take(code, axis=1)
        goal -= cols
        goal *= weight.take(code, axis=1)
        self._held = (slots, cols + goal)
        both = (count @ np.bincount(code, minlength=2 * p + 1)).tolist()  # Python ints: the pool's loop is scalar
        return both[:p], both[p:]
