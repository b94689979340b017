"""Admission (waiting -> running by KV capacity) and the per-step plan decision."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from enum import Enum

from engine.kv_cache import BlockManager
from engine.request import Request, Status


class Plan(Enum):
    PREFILL = "Prefill"
    DECODE = "Decode"
    SPECULATIVE = "SpeculativeDecode"
    GATED = "GatedSpeculativeDecode"


class Fallback(Enum):
    NOT_READY = "NotReady"  # some request has no captured context: plain decode, drafter state dropped
    GATED = "Gated"  # all draft-ready but the batch is over the gate: one-token verify, capture kept


@dataclass(frozen=True)
class Decision:
    plan: Plan
    fallback: Fallback | None = None


def decide_plan(num_active: int, has_drafter: bool, all_ready: bool, max_batch: int) -> Decision:
    """The decode-side plan for a step with no pending prefill. max_batch 0 = gate off.

    The gate trips while the active batch is at least max_batch and lets the batch speculate again
    once it shrinks below it, as upstream's gate does: MAX_BATCH=1 gates every round, so the
    one-token verify path is the only one exercised (the levers gate's first case relies on it)."""
    if num_active < 1:
        raise ValueError("no active request to plan for")
    if not has_drafter:
        return Decision(Plan.DECODE)
    if not all_ready:
        return Decision(Plan.DECODE, Fallback.NOT_READY)
    if max_batch and num_active >= max_batch:
        return Decision(Plan.GATED, Fallback.GATED)
    return Decision(Plan.SPECULATIVE)


@dataclass(frozen=True)
class ScheduledStep:
    decision: Decision
    requests: list[Request]


class Scheduler:
    def __init__(
        self,
        blocks: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        headroom: int,
        has_drafter: bool,
        max_batch: int,
    ):
        self.blocks = blocks
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.headroom = headroom
        self.has_drafter = has_drafter
        self.max_batch = max_batch
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._free_slots = list(range(max_num_seqs - 1, -1, -1))

    def blocks_needed(self, req: Request) -> int:
        return self.blocks.blocks_for(len(req.prompt_ids) + req.params.max_tokens + self.headroom)

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledStep | None:
        admitted: list[Request] = []
        tokens = 0
        while self.waiting and len(self.running) + len(admitted) < self.max_num_seqs:
            req = self.waiting[0]
            need = self.blocks_needed(req)
            if not self.blocks.can_allocate(need):
                break
            if admitted and tokens + len(req.prompt_ids) > self.max_num_batched_tokens:
                break
            self.waiting.popleft()
            req.blocks = self.blocks.allocate(need)
            req.slot = self._free_slots.pop()
            req.status = Status.RUNNING
            admitted.append(req)
            tokens += len(req.prompt_ids)
        if admitted:
            self.running.extend(admitted)
            return ScheduledStep(Decision(Plan.PREFILL), admitted)
        decode = [r for r in self.running if r.output_ids]
        if not decode:
            return None
        all_ready = all(r.draft_ready for r in decode)
        return ScheduledStep(decide_plan(len(decode), self.has_drafter, all_ready, self.max_batch), decode)

    def release(self, req: Request) -> None:
        """Return a finished request's blocks and slot."""
        if req in self.running:
            self.running.remove(req)
        if req.blocks:
            self.blocks.free(req.blocks)
            req.blocks = []
        if req.slot >= 0:
            self._free_slots.append(req.slot)
            req.slot = -1
