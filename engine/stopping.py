"""Stop strings, checked token by token on the decoded output, so a speculative round that commits
several tokens at once stops exactly where plain decode (one token a step) would."""

from __future__ import annotations

from collections.abc import Callable, Sequence


class StopStrings:
    """Finds the first stop string that the newest output token completes.

    `find(ids)` is called after each committed token with the whole output so far; it searches only
    text a new token can have changed (the tail from `longest - 1` characters before the previous
    end), so an occurrence is reported once, at the token that completes it."""

    def __init__(self, stops: Sequence[str], decode: Callable[[list[int]], str]):
        if not stops or not all(isinstance(s, str) and s for s in stops):
            raise ValueError(f"stop strings must be non-empty strings, got {stops!r}")
        self.stops = tuple(stops)
        self.decode = decode
        self.longest = max(len(s) for s in self.stops)
        self.checked = 0  # characters of stable text (no trailing partial character) already searched

    def find(self, ids: list[int]) -> int | None:
        """Character offset, in decode(ids), where the completed stop string starts; None if none."""
        text = self.decode(ids)
        start = max(0, self.checked - self.longest + 1)
        hits = [i for i in (text.find(s, start) for s in self.stops) if i >= 0]
        self.checked = len(text.rstrip("\ufffd"))  # a partial multi-byte character may still change
        return min(hits) if hits else None
