"""A decode-side step's successor launched before the host reads this step's tokens or accept rows
(docs/design/engine.md, "The speculative round launched ahead"; docs/architecture.md, Walk of one step).

A held one-token step is used only by the next step of the same kind over the same requests, in the same
order, at the committed rows it assumed; a held speculative round (k > 0) serves those of its requests
still at those rows. Anything else drops it: its writes lie past each request's committed rows."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from engine.request import Request


@dataclass
class HostTokens:
    """A step's greedy tokens on their way to the host: `host` is complete once `ready` has passed."""

    host: torch.Tensor
    ready: torch.cuda.Event | None  # None on CPU: the copy is done

    @classmethod
    def copy(cls, tokens: torch.Tensor) -> HostTokens:
        if tokens.device.type != "cuda":
            return cls(tokens.clone(), None)
        host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
        host.copy_(tokens, non_blocking=True)
        return cls(host, _event(tokens.device))

    def tolist(self) -> list[int]:
        if self.ready is not None:
            self.ready.synchronize()
        return self.host.tolist()


@dataclass
class Launched:
    """A step launched ahead: its requests, the committed rows each must have when it is used, its
    tokens (a speculative round's accept rows: on the device for the launch after it, and on their way
    to the host), and the previous step's copy (its `ready` event starts this step's device span).
    k: the drafts a speculative round verifies (0: a one-token step); drafted: its drafter's end."""

    reqs: list[Request]
    committed: list[int]  # each request's num_kv when the step is used
    gated: bool
    device_tokens: torch.Tensor
    tokens: HostTokens
    after: HostTokens
    k: int = 0
    result: object = None  # the speculative round's SpanResult
    drafted: torch.cuda.Event | None = None
    index: list[int] | None = None  # set by `take`: each request's row


class DecodeRunner(Protocol):
    """What the launch ahead needs of the runner (engine/runner.py ModelRunner)."""

    def stage(
        self, reqs: list[Request], limits: Sequence[int] | None = None, next_tokens: torch.Tensor | None = None
    ) -> None: ...
    def decode(self, reqs: list[Request]): ...  # a SpanResult: .greedy [N] on the device
    def assign_blocks(self, reqs: Sequence[Request]) -> None: ...
    def stage_round(self, reqs: list[Request], rows: torch.Tensor, k: int, index: list[int]) -> None: ...
    def draft(self, reqs: list[Request], heads: int | None = None) -> torch.Tensor: ...
    def verify(self, reqs: list[Request], drafts: torch.Tensor, k: int, accept) -> tuple: ...


# The scheduler's take_ahead(reqs, committed, speculative): the blocks of the step after `committed` more
# rows per request, taken now; the requests that grew, or None where the pool is short.
TakeBlocks = Callable[[list[Request], int, bool], list[Request] | None]


class OverlappedDecode:
    def __init__(self, runner: DecodeRunner, enabled: bool, take_blocks: TakeBlocks | None = None):
        self.runner, self.enabled, self.take_blocks = runner, enabled, take_blocks
        self.launched: Launched | None = None
        self.launches = self.used = 0  # steps launched ahead, and of them the ones a round used

    def eligible(self, reqs: list[Request], admitting: bool, k: int = 0) -> bool:
        """Whether the step after this one (of these requests, about to be committed; k: this speculative
        round's drafts, 0 a one-token step) can launch now: not where a one-token step may end a request by
        its budget, nor where a round may end every one. Where a request lacks the blocks of the rows that
        step writes, it takes them here."""
        if not self.enabled or admitting or not self.take_blocks:
            return False
        if not all(r.params.greedy and r.params.logprobs is None for r in reqs):
            return False
        lasting = [r.remaining >= k + 2 for r in reqs]  # k + 2 tokens left: this step cannot end it
        if not (any(lasting) if k else all(lasting)):
            return False
        grown = self.take_blocks(reqs, k + 1, k > 0)
        if grown is None:
            return False
        if grown:
            self.runner.assign_blocks(grown)  # in stream order, before the step that writes there
        return True

    def take(self, reqs: list[Request], gated: bool, k: int = 0) -> Launched | None:
        """The step launched ahead if it is this round's step, else None; either way it is no longer held.
        A speculative round's serves any of its requests still at the rows it assumed (the others ended):
        `index` maps each request to its row there."""
        launched, self.launched = self.launched, None
        if launched is None or launched.gated != gated or launched.k != k or (not k and launched.reqs != reqs):
            return None  # a one-token step serves exactly its requests, in order
        where = {id(r): i for i, r in enumerate(launched.reqs)}
        index = [where.get(id(r), -1) for r in reqs]
        if any(i < 0 or r.finished or r.num_kv != launched.committed[i] for r, i in zip(reqs, index, strict=True)):
            return None
        launched.index = index
        self.used += 1
        return launched

    def launch(self, reqs: list[Request], device_tokens: torch.Tensor, before: HostTokens, gated: bool) -> None:
        """Launch the step after the one whose greedy tokens are `device_tokens` (its copy to the host,
        `before`, already queued: this step's graph overwrites them)."""
        self.runner.stage(reqs, next_tokens=device_tokens)
        res = self.runner.decode(reqs)
        committed = [r.num_kv + 1 for r in reqs]
        self.launched = Launched(reqs, committed, gated, res.greedy, HostTokens.copy(res.greedy), before)
        self.launches += 1

    def launch_round(
        self, reqs: list[Request], rows: torch.Tensor, before: HostTokens, k: int, accept, index: list[int]
    ) -> None:
        """Launch the speculative round of span k for `reqs` after the one whose accept rows are `rows`
        (row index[i] is reqs[i]'s; their copy to the host, `before`, already queued: this round's verify
        graph overwrites them). The committed rows it assumes are known once this round settles (`settled`)."""
        self.runner.stage_round(reqs, rows, k, index)
        drafts = self.runner.draft(reqs, k)
        drafted = _event(rows.device)
        res, next_rows = self.runner.verify(reqs, drafts, k, accept)
        self.launched = Launched(reqs, [], False, next_rows, HostTokens.copy(next_rows), before, k, res, drafted)
        self.launches += 1

    def settled(self, reqs: list[Request]) -> None:
        """The round the held launch follows has committed: the launch assumed these committed rows."""
        if self.launched is not None and self.launched.k:
            self.launched.committed = [r.num_kv for r in reqs]

    def holds(self) -> bool:
        """A step launched ahead that the next step may use (a one-token step: none of its requests ended):
        the next step should be that one, not a prefill (whose request waits one step; else it is dropped)."""
        if self.launched is None:
            return False
        alive = [not r.finished for r in self.launched.reqs]
        return any(alive) if self.launched.k else all(alive)

    def drop(self) -> None:
        self.launched = None


def _event(device: torch.device) -> torch.cuda.Event | None:
    if device.type != "cuda":
        return None
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event
