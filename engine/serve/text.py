"""The streamed text deltas of one choice, and the logprobs objects of both APIs."""

from __future__ import annotations

import logging
from functools import partial

from engine.config import SamplingParams
from engine.request import RequestOutput
from engine.stopping import Detokenizer

log = logging.getLogger(__name__)


class Choice:
    """One choice's text as streamed: only text that can no longer change is sent. While running, a
    trailing incomplete character and the last (longest stop - 1) characters (a stop string may be
    forming) are held back; the finished output's text is the engine's final word. The running text
    is decoded incrementally (`Detokenizer`: a few tokens per update, not the whole output), and not
    at all for a choice that is not streamed."""

    def __init__(self, index: int, tokenizer, params: SamplingParams, stream: bool = True):
        self.index = index
        self.stream = stream
        self.hold = max((len(s) for s in params.stop), default=1) - 1
        self.text = None
        if tokenizer is not None:
            decode = partial(tokenizer.decode, skip_special_tokens=params.skip_special_tokens)
            self.text = Detokenizer(decode, self.hold)
        self.sent = 0  # characters sent
        self.scored = 0  # logprob entries already sent
        self.out: RequestOutput | None = None

    def new_logprobs(self) -> list:
        """Logprob entries of the tokens since the last call ([] when not asked for)."""
        entries = (self.out.logprobs or [])[self.scored :]
        self.scored += len(entries)
        return entries

    def update(self, out: RequestOutput) -> str:
        """The new text since the last call."""
        self.out = out
        if out.finished:
            new = out.text[self.sent :]
            self.sent = max(self.sent, len(out.text))
            return new
        if not self.stream or self.text is None or not out.token_ids:
            return ""
        self.text.feed(out.token_ids)
        window, origin = self.text.window  # origin <= sent: at most `hold` final characters were unsent
        end = self.text.done + len(self.text.tail.rstrip("\ufffd")) - self.hold
        if end <= self.sent:
            return ""
        new, self.sent = window[self.sent - origin : end - origin], end
        return new


def completion_logprobs(entries: list, tokenizer, offset: int) -> dict:
    """The completions API's logprobs object; `offset` is the text offset of the first entry."""
    tokens = [tokenizer.decode([e.token_id]) for e in entries]
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t)
    return {
        "tokens": tokens,
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [{tokenizer.decode([i]): v for i, v in e.top} for e in entries],
        "text_offset": offsets,
    }


def chat_logprobs(entries: list, tokenizer) -> dict:
    """The chat API's logprobs object: one item per token, with its top alternatives."""

    def item(token_id: int, logprob: float) -> dict:
        text = tokenizer.decode([token_id])
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    return {
        "content": [{**item(e.token_id, e.logprob), "top_logprobs": [item(i, v) for i, v in e.top]} for e in entries]
    }
