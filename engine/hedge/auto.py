"""The auto-hedge controller: how many branch positions (C) to use, from measured committed tokens
per second in windows of rounds per C (docs/design/hedging.md, section 3)."""

from __future__ import annotations

import logging
import statistics
import time
from collections import deque
from collections.abc import Callable

log = logging.getLogger(__name__)


class AutoHedge:
    """Explores C = 0..max_chains, one window of rounds each in rotation, for `cycles` cycles; commits to
    the best median window rate (a larger C only when it beats the best so far by `margin`); holds for
    `hold` rounds, then re-explores with `rewindow`-round windows. Time is the host gap between ticks; a
    gap over `gap_s` and `break_window()` discard the partial window, so such intervals count to no C."""

    def __init__(
        self,
        max_chains: int,
        clock: Callable[[], float] = time.perf_counter,
        window: int = 64,
        rewindow: int = 32,
        keep: int = 12,
        cycles: int = 3,
        margin: float = 1.03,
        hold: int = 4096,
        gap_s: float = 0.5,
    ):
        if max_chains < 0 or window < 1 or rewindow < 1 or keep < 1 or cycles < 1 or hold < 1:
            raise ValueError("AutoHedge: max_chains >= 0 and positive window/rewindow/keep/cycles/hold")
        self.max_chains, self.clock = max_chains, clock
        self.window, self.rewindow, self.cycles, self.margin = window, rewindow, cycles, margin
        self.hold, self.gap_s = hold, gap_s
        self.rates: dict[int, deque[float]] = {c: deque(maxlen=keep) for c in range(max_chains + 1)}
        self.committed: int | None = None  # None while exploring
        self.held = 0
        self._explore_at, self._cycles_done = 0, 0
        self._last: float | None = None
        self._reset_window()
        log.info("spec hedge auto: controller on (C in 0..%d)", max_chains)

    def _reset_window(self) -> None:
        self._win_c: int | None = None
        self._win_rounds, self._win_tokens, self._win_seconds = 0, 0, 0.0

    def chains(self) -> int:
        """C for the next round."""
        return self.committed if self.committed is not None else self._explore_at

    def break_window(self) -> None:
        """A round that is no hedging sample (a gated round): drop the partial window and the last
        tick, so the next round only re-anchors the clock."""
        self._last = None
        self._reset_window()

    def reanchor(self) -> None:
        """A step that is no verify round ran (prefill, plain decode): the next tick only re-anchors,
        so that step's time is charged to no C; the window keeps its rounds."""
        self._last = None

    def tick(self, executed: int, committed_tokens: int) -> None:
        """A verify round finished that ran `executed` chains per hedged request and committed
        `committed_tokens` over the batch."""
        now = self.clock()
        last, self._last = self._last, now
        if last is None:
            return  # re-anchor: the interval before this round is unknown
        gap = now - last
        if gap > self.gap_s:
            self._reset_window()
            return
        if self._win_c is not None and self._win_c != executed:
            self._reset_window()
        self._win_c = executed
        self._win_rounds += 1
        self._win_tokens += committed_tokens
        self._win_seconds += gap
        holding = self.committed is not None
        if self._win_rounds >= self.window:
            self._book()
        if holding:
            self.held += 1
            if self.held >= self.hold:
                log.info("spec hedge auto: re-exploring (held C=%d)", self.committed)
                self._explore()

    def _explore(self) -> None:
        """Re-explore from C = 0 on fresh, shorter (`rewindow`-round) windows."""
        self.committed, self.held, self.window = None, 0, self.rewindow
        self._explore_at, self._cycles_done = 0, 0
        for rates in self.rates.values():
            rates.clear()  # the load may have changed: decide on fresh windows only
        self._reset_window()

    def _book(self) -> None:
        c = min(self._win_c, self.max_chains)
        if self._win_seconds > 0:
            self.rates[c].append(self._win_tokens / self._win_seconds)
        self._reset_window()
        if self.committed is not None:
            return
        self._explore_at += 1
        if self._explore_at > self.max_chains:
            self._explore_at = 0
            self._cycles_done += 1
            if self._cycles_done >= self.cycles:
                self._commit()

    def medians(self) -> dict[int, float | None]:
        return {c: statistics.median(r) if r else None for c, r in self.rates.items()}

    def _commit(self) -> None:
        med = self.medians()
        best = next((c for c in sorted(med) if med[c] is not None), 0)
        for c in sorted(med):
            if c > best and med[c] is not None and med[c] > med[best] * self.margin:
                best = c
        self.committed, self.held = best, 0
        log.info(
            "spec hedge auto: committed C=%d (median window tok/s by C: %s)",
            best,
            [None if m is None else round(m, 1) for m in med.values()],
        )
