"""The draining wave (no request waits for a slot): K valued over the time to finish the whole wave under
one K held. Request i finishes at the first round t with S_t >= r_i (its remaining tokens), S_t a sum of t
committed counts taken as normal; the expected batch at round t is the sum of P(S_t < r_i); K=0 is exact."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from itertools import accumulate
from operator import mul

import numpy as np

GRID = 48  # rounds sampled over a longer wave (their costs summed, scaled by the spacing)


def committed_moments(conditional: Sequence[float], k: int) -> tuple[float, float]:
    """Mean and variance of the tokens a request commits in a round of k drafts (1 + accepted drafts)."""
    reach = [1.0, *accumulate(conditional[:k], mul)]  # P(C >= m) for m = 1 .. k + 1
    mean = sum(reach)
    second = sum((2 * m + 1) * p for m, p in enumerate(reach))  # E[C^2] = sum (2m - 1) P(C >= m)
    return mean, max(second - mean * mean, 0.0)


def _normal_cdf(z: np.ndarray) -> np.ndarray:
    """Phi(z) by Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7): numpy has no erf."""
    x = np.abs(z) / math.sqrt(2.0)
    t = 1.0 / (1.0 + 0.3275911 * x)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return 0.5 * (1.0 + np.sign(z) * (1.0 - poly * np.exp(-x * x)))


def wave(remaining: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """The distinct remaining token counts and how many requests have each (wave_ms's r, n)."""
    r, n = np.unique(np.asarray(remaining, dtype=float), return_counts=True)
    return r, n.astype(float)


def wave_ms(r: np.ndarray, n: np.ndarray, round_ms: np.ndarray, mean: float, var: float) -> float:
    """Expected ms to finish the wave, a round of b requests costing round_ms[b] (b = 1 .. batch); a round t
    runs sum(n * P(S_t < r)) requests, and past the expected end counts by the chance it runs."""
    top = float(r[-1])
    horizon = (top - 0.5) / mean + 4.0 * math.sqrt(var * top / mean) / mean + 1.0
    if horizon <= GRID:
        rounds, step = np.arange(math.ceil(horizon), dtype=float), 1.0
    else:
        rounds, step = np.linspace(0.0, horizon, GRID, endpoint=False), horizon / GRID
    t = rounds[:, None]
    if var == 0.0:
        alive = (t * mean < r[None, :] - 0.5).astype(float)
    else:
        alive = np.where(t == 0, 1.0, _normal_cdf((r[None, :] - 0.5 - t * mean) / np.sqrt(np.maximum(t, 1e-9) * var)))
    batch = alive @ n
    at = np.clip(np.rint(batch), 1, len(round_ms) - 1).astype(int)
    return float(step * np.sum(round_ms[at] * np.minimum(batch, 1.0)))


class WaveValues:
    """Per candidate K: the wave's remaining tokens per expected ms to finish it (a speculative K's / (1 +
    `discount`)) from round_times(batch, cap, context) and host_ms(bucket, speculative); reused REUSE
    times at one (batch, cap, context) until `forget`."""

    REUSE = 4

    def __init__(self, round_times: Callable, host_ms: Callable[[int, bool], float], discount: float):
        self.round_times, self.host_ms, self.discount = round_times, host_ms, discount
        self._tables: dict[tuple, tuple[list[int], np.ndarray]] = {}  # (cap, context) -> (candidates, ms[K, batch])
        self._last: tuple[tuple, int, dict[int, float]] | None = None  # (batch, cap, context), uses, values

    def __call__(self, remaining: Sequence[int], cap: int, rates: Sequence[float], context: int | None) -> dict:
        key = (len(remaining), cap, context)
        if self._last is None or self._last[0] != key or self._last[1] >= self.REUSE:
            self._last = (key, 0, self.evaluate(remaining, cap, rates, context))
        self._last = (key, self._last[1] + 1, self._last[2])
        return self._last[2]

    def forget(self) -> None:
        self._last = None

    def evaluate(self, remaining: Sequence[int], cap: int, rates: Sequence[float], context: int | None = None) -> dict:
        """The values afresh; rates: the conditional acceptance per position."""
        candidates, device = self.table(cap, len(remaining), context)
        log2 = np.ceil(np.log2(np.arange(1, device.shape[1]))).astype(int)  # batch b's bucket
        host = {s: np.array([self.host_ms(1 << j, s) for j in range(int(log2[-1]) + 1)])[log2] for s in (False, True)}
        r, n = wave(remaining)
        total, values = float(r @ n), {}
        for i, k in enumerate(candidates):
            ms = wave_ms(r, n, np.concatenate(([0.0], device[i, 1:] + host[k > 0])), *committed_moments(rates, k))
            values[k] = total / ms / (1.0 + self.discount if k else 1.0)
        return values

    def table(self, cap: int, batch: int, context: int | None = None) -> tuple[list[int], np.ndarray]:
        """The candidates and the table's ms per candidate (rows) and batch (columns 1 .. >= batch; column 0
        unused), widened to the next power of two when outgrown."""
        cached = self._tables.get((cap, context))
        if cached is None or cached[1].shape[1] <= batch:
            rows = [self.round_times(b, cap, context) for b in range(1, 1 << batch.bit_length())]
            candidates = sorted(rows[0])
            table = np.array([[0.0] + [t[k] for t in rows] for k in candidates])
            cached = self._tables[cap, context] = candidates, table
        return cached
