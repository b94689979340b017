"""One-token steps with the host's work under the device's: a plain decode step, a gated round under
the static policy, or one the adaptive policy chose where its plan for the next round gates the same
requests again, launches the step after it before it reads its own tokens, so the device
runs step t + 1 while the host commits step t's tokens, reports, schedules and stages (otherwise
0.1-0.3 ms a step with the device idle: the decode doc's host share).

The step launched ahead takes its tokens from the device (step t's argmax), its positions one past
step t's, and the same block-table rows. The next one-token round uses it only if it is exactly the
step that round would run: of the same kind (plain or gated), the same requests, in the same order,
each at the committed rows the launch assumed. Anything else drops it (a request ended on a stop
token, was aborted or preempted, a prefill came between): its only effect then is the K/V (and,
with a drafter, the context rows) it wrote one row past each request's committed rows, which the
step that runs instead writes again, or which sits in blocks given back only after the stream has
run it. So every token is the one the step-by-step path produces.

A step is launched ahead only where nothing the host is about to learn could change it: every
request greedy and without logprobs, none at its last token, and no request that could be admitted
first (one waiting while a slot is free: the next step would be its prefill). Each request must hold
the KV block of the row it writes; at a block boundary that block is taken then (the scheduler's
growth one step early) where the free pool has it, so those steps launch ahead too, its block-table
row copied from pinned memory so the host does not wait for the step already running (runner.py).
"""

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
        ready = torch.cuda.Event(enable_timing=True)
        ready.record()
        return cls(host, ready)

    def tolist(self) -> list[int]:
        if self.ready is not None:
            self.ready.synchronize()
        return self.host.tolist()


@dataclass
class Launched:
    """A step launched ahead: its requests, the committed rows each must have when it is used, its
    tokens (on the device for the launch after it, and on their way to the host), and the previous
    step's token copy (its `ready` event starts this step's device span)."""

    reqs: list[Request]
    num_kv: list[int]
    gated: bool
    device_tokens: torch.Tensor
    tokens: HostTokens
    after: HostTokens


class DecodeRunner(Protocol):
    """What the launch ahead needs of the runner (engine/runner.py ModelRunner)."""

    block_size: int

    def stage(
        self, reqs: list[Request], limits: Sequence[int] | None = None, next_tokens: torch.Tensor | None = None
    ) -> None: ...
    def decode(self, reqs: list[Request]): ...  # a SpanResult: .greedy [N] on the device
    def assign_blocks(self, reqs: Sequence[Request]) -> None: ...


# The scheduler's take_ahead: the blocks of one more row for these requests, or None where the pool is short.
TakeBlocks = Callable[[list[Request]], list[Request] | None]


class OverlappedDecode:
    def __init__(self, runner: DecodeRunner, enabled: bool, take_blocks: TakeBlocks | None = None):
        self.runner, self.enabled, self.take_blocks = runner, enabled, take_blocks
        self.launched: Launched | None = None
        self.launches = self.used = 0  # steps launched ahead, and of them the ones a round used

    def eligible(self, reqs: list[Request], admitting: bool) -> bool:
        """Whether the step after this one (of these requests, about to be committed) can launch now.
        Where a request lacks the block of the row that step writes, it takes it here."""
        if not self.enabled or admitting:
            return False
        if not all(r.params.greedy and r.params.logprobs is None and r.remaining >= 2 for r in reqs):
            return False
        rows = self.runner.block_size
        short = [r for r in reqs if len(r.blocks) * rows < r.num_kv + 2]
        if not short:
            return True
        grown = self.take_blocks(short) if self.take_blocks else None
        if grown is None:
            return False
        self.runner.assign_blocks(grown)  # in stream order, before the step that writes there
        return True

    def take(self, reqs: list[Request], gated: bool) -> Launched | None:
        """The step launched ahead if it is this round's step, else None; either way it is no longer held."""
        launched, self.launched = self.launched, None
        if launched is None or launched.gated != gated or len(launched.reqs) != len(reqs):
            return None
        pairs = zip(reqs, launched.reqs, launched.num_kv, strict=True)
        if any(a is not b or a.finished or a.num_kv != kv for a, b, kv in pairs):
            return None
        self.used += 1
        return launched

    def launch(self, reqs: list[Request], device_tokens: torch.Tensor, before: HostTokens, gated: bool) -> None:
        """Launch the step after the one whose greedy tokens are `device_tokens` (its copy to the host,
        `before`, already queued: this step's graph overwrites them)."""
        self.runner.stage(reqs, next_tokens=device_tokens)
        res = self.runner.decode(reqs)
        num_kv = [r.num_kv + 1 for r in reqs]
        self.launched = Launched(reqs, num_kv, gated, res.greedy, HostTokens.copy(res.greedy), before)
        self.launches += 1

    def drop(self) -> None:
        self.launched = None
