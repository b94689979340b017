"""Admission (waiting -> running by KV capacity) and the per-step plan decision."""

from __future__ import annotations

from collections import deque
from enum import Enum

from engine.kv_cache import BlockManager
from engine.request import Request


class Plan(Enum):
    PREFILL = "Prefill"
    DECODE = "Decode"
    SPECULATIVE = "SpeculativeDecode"
    GATED = "GatedSpeculativeDecode"


def decide_plan(num_active: int, has_drafter: bool, all_ready: bool, max_batch: int) -> Plan:
    """The decode-side plan for a step with no pending prefill. max_batch 0 = gate off.

    Two distinct fallbacks from speculation: NotReady (some request has no captured context) is a
    plain decode, which drops the drafter state; Gated (all draft-ready, the batch at or above
    max_batch, as upstream's gate) is a one-token round that keeps the capture. MAX_BATCH=1 gates
    every round, so the one-token verify path is the only one exercised."""
    if num_active < 1:
        raise ValueError("no active request to plan for")
    if not has_drafter or not all_ready:
        return Plan.DECODE
    if max_batch and num_active >= max_batch:
        return Plan.GATED
    return Plan.SPECULATIVE


class Scheduler:
    def __init__(
        self,
        blocks: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        headroom: int,
        has_drafter: bool,
        max_batch: int,
        max_model_len: int,
        vocab_size: int,
    ):
        self.blocks = blocks
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.headroom = headroom
        self.has_drafter = has_drafter
        self.max_batch = max_batch
        self.max_model_len, self.vocab_size = max_model_len, vocab_size
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._free_slots = list(range(max_num_seqs - 1, -1, -1))

    def blocks_needed(self, req: Request) -> int:
        return self.blocks.blocks_for(len(req.prompt_ids) + req.params.max_tokens + self.headroom)

    def admission_error(self, req: Request) -> str | None:
        """Why the engine can never serve this request (None: it can)."""
        n, budget, vocab = len(req.prompt_ids), req.params.max_tokens, self.vocab_size
        if n == 0:
            return "empty prompt"
        bad = [t for t in req.prompt_ids if not 0 <= t < vocab]
        if bad:
            return f"prompt token id {bad[0]} outside the vocabulary [0, {vocab})"
        limit = self.max_model_len - self.headroom
        why = f"the context limit {limit}"
        if self.headroom:
            why += f" (max_model_len {self.max_model_len} minus the drafter's block headroom {self.headroom})"
        if n >= limit:
            return f"prompt of {n} tokens is longer than {why}"
        if n + budget > limit:
            return f"prompt ({n} tokens) + max_tokens ({budget}) = {n + budget} exceeds {why}"
        need = self.blocks_needed(req)
        if need > self.blocks.capacity:
            return f"needs {need} KV blocks but the cache holds {self.blocks.capacity}"
        return None

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> tuple[Plan, list[Request]] | None:
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
            req.admitted(self._free_slots.pop(), self.blocks.allocate(need))
            admitted.append(req)
            tokens += len(req.prompt_ids)
        if admitted:
            self.running.extend(admitted)
            return Plan.PREFILL, admitted
        decode = [r for r in self.running if r.output_ids]
        if not decode:
            return None
        all_ready = all(r.draft_ready for r in decode)
        return decide_plan(len(decode), self.has_drafter, all_ready, self.max_batch), decode

    def release(self, req: Request) -> None:
        """Drop a finished request from the queues and take back its blocks and slot."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        slot, blocks = req.released()
        if blocks:
            self.blocks.free(blocks)
        if slot >= 0:
            self._free_slots.append(slot)
