"""A request's state: tokens, budget, KV blocks and drafter context."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from functools import partial

import torch

from engine.config import SamplingParams
from engine.outputs import CompletionOutput, Logprob, RequestOutput
from engine.stopping import Detokenizer, StopStrings

__all__ = ["Finish", "Request", "RequestFailure", "RequestOutput", "Status"]


class Status(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Finish(str, Enum):
    STOP = "stop"  # EOS or a stop token (included in the output)
    LENGTH = "length"  # max_tokens reached
    REJECTED = "rejected"  # refused at admission; `error` says why
    ABORT = "abort"  # Engine.abort: the caller gave up on it
    ERROR = "error"  # a fault while serving it; `error` holds the message


class RequestFailure(Exception):
    """A fault attributed to particular requests (e.g. a sampling distribution with NaN): they finish
    as `error`, and the step's other requests, whose state it left untouched, run it again."""

    def __init__(self, failed: dict[Request, str]):
        super().__init__("; ".join(f"{r.id}: {why}" for r, why in failed.items()))
        self.failed = failed


@dataclass(eq=False)
class Request:
    index: int
    prompt_ids: list[int]
    params: SamplingParams
    stop_ids: frozenset[int]
    output_ids: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    finish_reason: Finish | None = None
    error: str | None = None
    slot: int = -1  # row of the block-table tensor
    blocks: list[int] = field(default_factory=list)
    num_kv: int = 0  # tokens whose K/V are committed in the target cache
    generator: torch.Generator | None = None
    # Drafter state: feature rows not yet in the drafter cache, and how many rows are.
    draft_ready: bool = False
    ctx_pending: list[torch.Tensor] = field(default_factory=list)
    draft_kv_len: int = 0
    streamed: int = 0  # output tokens already reported by step()
    stop_strings: StopStrings | None = None
    detokenizer: Detokenizer | None = None  # the running text's (the stop strings' own where there are some)
    stop_at: int | None = None  # character offset of the stop string that ended the request
    stop_reason: int | str | None = None  # the stop token id (not EOS) or stop string that ended it
    logprobs: list = field(default_factory=list)
    prompt: str | None = None  # the prompt's text, when it was given as text
    shaped: list = field(default_factory=list)  # vLLM-shaped logprob dicts of the first len(shaped) entries

    @property
    def id(self) -> str:
        return f"req-{self.index}"

    @property
    def prefill_ids(self) -> list[int]:
        """What a (re-)prefill writes: the prompt, and after a preemption the committed output too,
        except the current token (the next step's input)."""
        return self.prompt_ids + self.output_ids[:-1]

    @property
    def current_token(self) -> int:
        """The last sampled token: next step's input, its K/V not yet written."""
        return self.output_ids[-1]

    @property
    def remaining(self) -> int:
        return self.params.max_tokens - len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    @property
    def draft_context_len(self) -> int:
        """Feature rows the drafter holds for this request: stored in its KV plus pending."""
        return self.draft_kv_len + sum(t.shape[0] for t in self.ctx_pending)

    # -- transitions: the only code that changes a request's state ----------------------------------
    def admitted(self, slot: int, blocks: list[int]) -> None:
        self.slot, self.blocks, self.status = slot, blocks, Status.RUNNING

    def grew(self, blocks: list[int]) -> None:
        """More KV blocks, taken before a step writes past the held ones."""
        self.blocks = self.blocks + blocks

    def released(self) -> tuple[int, list[int]]:
        """Give back the block-table slot and the KV blocks (slot -1 and [] when none were held)."""
        slot, blocks = self.slot, self.blocks
        self.slot, self.blocks = -1, []
        return slot, blocks

    def prefilled(self, token: int | None, context_stored: bool) -> None:
        """The K/V of `prefill_ids` (and, with a drafter, their context rows) are written; `token` is
        the sampled first output, None when resuming after a preemption (the current token stays)."""
        self.num_kv = len(self.prefill_ids)
        if context_stored:
            self.ctx_pending, self.draft_kv_len, self.draft_ready = [], self.num_kv, True
        if token is not None:
            self._commit([token])

    def preempted(self) -> None:
        """Blocks and slot handed back (`released`): waiting again, committed tokens kept; its K/V and
        drafter context are rebuilt by a re-prefill of `prefill_ids`."""
        self.status, self.num_kv = Status.WAITING, 0
        self.drop_draft_state()

    def advanced(self, accepted: list[int], bonus: int, keep_context: bool) -> int:
        """A round committed `accepted` drafts plus the target's `bonus` token (a one-token round has
        no drafts); the K/V of [current, *accepted] is now committed. `keep_context`: the forward
        stored their feature rows as drafter context too (a plain decode drops the drafter state
        instead). Returns the tokens committed."""
        committed = self._commit([*accepted, bonus])
        if self.finished:
            return committed
        self.num_kv += len(accepted) + 1
        if keep_context:
            self.draft_kv_len = self.num_kv
        else:
            self.drop_draft_state()
        return committed

    def context_pending(self, rows: torch.Tensor) -> None:
        """The last len(rows) committed positions take these feature rows (a winning hedge chain's)
        in place of the stored ones; they are stored before the next draft."""
        self.ctx_pending, self.draft_kv_len = [rows], self.num_kv - rows.shape[0]

    def context_flushed(self) -> None:
        """The pending rows are now in the drafter's KV."""
        self.ctx_pending, self.draft_kv_len = [], self.num_kv

    def scored(self, entries: list) -> None:
        """Log-probabilities of the latest committed tokens, in order."""
        self.logprobs.extend(entries)

    def finish(self, reason: Finish, error: str | None = None) -> None:
        self.status, self.finish_reason, self.error = Status.FINISHED, reason, error
        self.drop_draft_state()

    def drop_draft_state(self) -> None:
        self.draft_ready, self.ctx_pending, self.draft_kv_len = False, [], 0

    def _commit(self, tokens: list[int]) -> int:
        """Append tokens until a stop token, a stop string or the budget ends the request; returns how
        many. One token at a time, so a speculative run stops where plain decode would. Before
        min_tokens, stop tokens and stop strings are ignored (the strings' scan still advances)."""
        for n, token in enumerate(tokens, start=1):
            self.output_ids.append(token)
            honoured = len(self.output_ids) >= self.params.min_tokens
            if honoured and token in self.stop_ids:
                self.stop_reason = token if token in self.params.stop_token_ids else None
                self.finish(Finish.STOP)
                return n
            at = self.stop_strings.find(self.output_ids) if self.stop_strings else None
            if honoured and at is not None:
                self.stop_at, self.stop_reason = at, self.stop_strings.matched
                self.finish(Finish.STOP)
                return n
            if self.remaining <= 0:
                self.finish(Finish.LENGTH)
                return n
        return len(tokens)

    def output(self, tokenizer) -> RequestOutput:
        """The public view; new_token_ids are those since the previous call."""
        new = self.output_ids[self.streamed :]
        self.streamed = len(self.output_ids)
        text = self._text(tokenizer) if tokenizer is not None and self.output_ids else ""
        reason = self.finish_reason.value if self.finish_reason else None
        logprobs = shaped = cumulative = None
        if self.params.logprobs is not None:
            logprobs, shaped = list(self.logprobs), self._shaped_logprobs(tokenizer)
            cumulative = sum(e.logprob for e in self.logprobs)
        ids = list(self.output_ids)
        completion = CompletionOutput(0, text, ids, cumulative, shaped, reason, self.stop_reason)
        return RequestOutput(
            *(self.id, self.prompt_ids, ids, new, self.finished, reason, self.error, text, logprobs),
            prompt=self.prompt,
            outputs=[completion],
        )

    def _text(self, tokenizer) -> str:
        """Finished: the whole decode, ended before the stop string unless include_stop_str_in_output.
        Running: the text so far, decoded incrementally (a few tokens a call), less an incomplete last
        character and the last (longest stop - 1) characters a stop string may still take back, so that
        it is a prefix of the final text."""
        skip = self.params.skip_special_tokens
        if self.finished:
            end = self.stop_at
            if end is not None and self.params.include_stop_str_in_output:
                end += len(self.stop_reason)
            return tokenizer.decode(self.output_ids, skip_special_tokens=skip)[:end]
        stops = self.stop_strings
        if self.detokenizer is None:
            decode = partial(tokenizer.decode, skip_special_tokens=skip)
            self.detokenizer = stops.text if stops else Detokenizer(decode, 0)
        if self.detokenizer.fed < len(self.output_ids):
            self.detokenizer.feed(self.output_ids)
        text = self.detokenizer.text
        hold = stops.longest - 1 if stops and not self.params.include_stop_str_in_output else 0
        return text[: len(text) - hold] if hold < len(text) else ""

    def _shaped_logprobs(self, tokenizer) -> list[dict[int, Logprob]]:
        """vLLM's per-position {token id: Logprob}: the chosen token first, then the top k; built once
        per entry (a streamed request pays for each token once)."""

        def text(token: int) -> str | None:
            return tokenizer.decode([token]) if tokenizer is not None else None

        for e in self.logprobs[len(self.shaped) :]:
            position = {e.token_id: Logprob(e.logprob, e.rank, text(e.token_id))}
            for rank, (token, value) in enumerate(e.top, start=1):
                position.setdefault(token, Logprob(value, rank, text(token)))
            self.shaped.append(position)
        return list(self.shaped)
