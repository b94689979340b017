"""Stop strings, checked token by token on the incrementally decoded output, so a speculative round stops
exactly where plain decode would (docs/design/engine.md, "Stop strings")."""

from __future__ import annotations

from collections.abc import Callable, Sequence


class Detokenizer:
    """decode(ids) kept up to date for a token list that only grows, with vLLM's prefix / read offsets:
    text up to a token boundary ending on a whole character is final (`done` characters: all in `text`,
    the last `keep` in `window`); each feed decodes only the tokens after it."""

    def __init__(self, decode: Callable[[list[int]], str], keep: int):
        self.decode = decode
        self.keep = keep
        self.prefix = 0  # first token of the decoded context
        self.read = 0  # tokens whose text is final
        self.prefix_text = ""  # decode(ids[prefix:read])
        self.final: list[str] = []  # the final text, in pieces joined when read (`text`)
        self.done = 0  # characters of final text
        self.kept = ""  # its last `keep` characters
        self.tail = ""  # text of the tokens after `read`, maybe ending inside a character (U+FFFD)
        self.fed = 0  # tokens seen by the last feed

    def feed(self, ids: list[int]) -> None:
        """Take the output so far (the previous ids plus new ones): the previous tail becomes final if
        it ended on a whole character, then the text after the final part is decoded."""
        if self.fed > self.read and not self.tail.endswith("\ufffd"):  # ids[read:fed] are final
            self.done += len(self.tail)
            self.final.append(self.tail)
            self.kept = (self.kept + self.tail)[-self.keep :] if self.keep else ""
            self.prefix, self.read = self.read, self.fed
            self.prefix_text = self.decode(ids[self.prefix : self.read])
        self.tail = self.decode(ids[self.prefix :])[len(self.prefix_text) :]
        self.fed = len(ids)

    @property
    def text(self) -> str:
        """decode(ids) as far as fed, less a trailing incomplete character."""
        self.final = ["".join(self.final)]
        return self.final[0] + self.tail.rstrip("\ufffd")

    @property
    def window(self) -> tuple[str, int]:
        """(the held final characters and the tail, the offset in decode(ids) of its first character)."""
        return self.kept + self.tail, self.done - len(self.kept)


class StopStrings:
    """The first stop string that the newest output token completes: `find(ids)` after each committed
    token, with the whole output so far, reports an occurrence once, at the token that completes it;
    `matched` is the stop string found."""

    def __init__(self, stops: Sequence[str], decode: Callable[[list[int]], str]):
        if not stops or not all(isinstance(s, str) and s for s in stops):
            raise ValueError(f"stop strings must be non-empty strings, got {stops!r}")
        self.stops = tuple(stops)
        self.longest = max(len(s) for s in self.stops)
        self.text = Detokenizer(decode, self.longest - 1)
        self.checked = 0  # characters of stable text (no trailing partial character) already searched
        self.matched: str | None = None

    def find(self, ids: list[int]) -> int | None:
        """Character offset, in decode(ids), where the completed stop string starts; None if none."""
        self.text.feed(ids)
        window, origin = self.text.window
        start = max(0, self.checked - self.longest + 1, origin) - origin  # final text ends whole: origin <= start
        hits = [(i + origin, s) for s in self.stops if (i := window.find(s, start)) >= 0]
        self.checked = self.text.done + len(self.text.tail.rstrip("\ufffd"))  # a partial character may change
        if not hits:
            return None
        at, self.matched = min(hits, key=lambda hit: hit[0])
        return at
