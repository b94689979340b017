"""Admission (waiting -> running on the prompt), KV growth and preemption, and the per-step plan.

KV blocks are taken as tokens are produced (a prefill's at admission, then before each decode-side step
the rows it can write); a dry pool preempts the youngest running request. Admission keeps one round of
growth free for every running request, so the oldest always fits and every decode step commits tokens.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import Enum

from engine.kv_cache import BlockManager
from engine.levers import Levers, gated
from engine.request import Request


class Plan(Enum):
    PREFILL = "Prefill"
    DECODE = "Decode"
    SPECULATIVE = "SpeculativeDecode"
    GATED = "GatedSpeculativeDecode"


def decide_plan(num_active: int, has_drafter: bool, all_ready: bool, max_batch: int) -> Plan:
    """The decode-side plan for a step with no pending prefill (max_batch 0 = gate off): DECODE when some
    request has no captured context (the drafter state is dropped), GATED while the batch is at or above
    max_batch (a one-token round that keeps the capture), else SPECULATIVE."""
    if num_active < 1:
        raise ValueError("no active request to plan for")
    if not has_drafter or not all_ready:
        return Plan.DECODE
    if gated(num_active, max_batch):
        return Plan.GATED
    return Plan.SPECULATIVE


@dataclass
class Step:
    plan: Plan
    reqs: list[Request]
    grown: list[Request] = field(default_factory=list)  # requests whose block lists changed: new table rows


class Scheduler:
    def __init__(
        self,
        blocks: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        headroom: int,
        has_drafter: bool,
        levers: Levers,
        max_model_len: int,
        vocab_size: int,
        round_rows: int = 1,
    ):
        self.blocks, self.max_num_seqs, self.max_num_batched_tokens = blocks, max_num_seqs, max_num_batched_tokens
        self.headroom, self.has_drafter = headroom, has_drafter
        self.levers = levers  # the engine's, replaced whole when they change (Engine.set_levers)
        self.max_model_len, self.vocab_size = max_model_len, vocab_size
        self.round_rows = round_rows  # rows past num_kv a speculative round writes (span, drafter block)
        self.reserve_budget = False  # True: admit with the whole budget reserved, never preempt (benchmarks)
        self.preemptions = 0
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
        try:
            req.params.validate_for(vocab)
        except ValueError as err:
            return str(err)
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

    @property
    def num_free_slots(self) -> int:
        return len(self._free_slots)

    @property
    def may_admit(self) -> bool:
        """Whether the next step could be a prefill: a request waits and a slot is free."""
        return bool(self.waiting) and bool(self._free_slots)

    def describe(self) -> str:
        free, cap = self.blocks.num_free, self.blocks.capacity
        return f"{len(self.waiting)} waiting, {len(self.running)} running, {free} of {cap} KV blocks free"

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self, admit: bool = True) -> Step | None:
        """The next step: a prefill of the requests admitted now (admit False: none while a running
        request can take a decode-side step), else a decode-side step of every running request past its
        prefill."""
        if (admit or not any(r.output_ids for r in self.running)) and (admitted := self._admit()):
            return Step(Plan.PREFILL, admitted, admitted)
        grown: list[Request] = []
        while True:
            decode = [r for r in self.running if r.output_ids]
            if not decode:
                return None
            plan = decide_plan(len(decode), self.has_drafter, all(r.draft_ready for r in decode), self.levers.max_batch)
            if self._grow(decode, self.round_rows if plan is Plan.SPECULATIVE else 1, grown):
                return Step(plan, decode, [r for r in dict.fromkeys(grown) if r in self.running])

    def take_ahead(self, reqs: list[Request], committed: int, speculative: bool) -> list[Request] | None:
        """The blocks of the step after up to `committed` more rows per request (its budget caps them; a
        speculative round's or a one-token step's), taken now for a step launched ahead
        (engine/decode_overlap.py): the requests that grew, or None where the free pool is short (then
        nothing is taken, and the next schedule grows or preempts as it would have)."""
        step = self.round_rows if speculative else 1
        return self._take(reqs, [self._shortfall(r, min(committed, r.remaining) + step) for r in reqs])

    def _take(self, reqs: list[Request], needs: list[int]) -> list[Request] | None:
        """needs[i] blocks for reqs[i] where the free pool holds all of them: the requests that grew, else
        None (nothing taken)."""
        if sum(needs) > self.blocks.num_free:
            return None
        grown = []
        for req, need in zip(reqs, needs, strict=True):
            if need:
                req.grew(self.blocks.allocate(need))
                grown.append(req)
        return grown

    def _shortfall(self, req: Request, rows: int) -> int:
        """Blocks `req` still needs for a step writing `rows` rows past its K/V (after its prefill)."""
        kv = req.num_kv or len(req.prefill_ids)
        return max(0, self.blocks.blocks_for(kv + rows) - len(req.blocks))

    def _admit(self) -> list[Request]:
        """Waiting requests in order while a slot, the token budget and the pool allow: each takes
        the blocks of its prefill, and one round of growth stays free for every running request."""
        admitted: list[Request] = []
        tokens = 0
        ahead = sum(self._shortfall(r, self.round_rows) for r in self.running) if self.waiting else 0
        while self.waiting and len(self.running) + len(admitted) < self.max_num_seqs:
            req = self.waiting[0]
            n = len(req.prefill_ids)
            if admitted and tokens + n > self.max_num_batched_tokens:
                break
            take = self.blocks_needed(req) if self.reserve_budget else self.blocks.blocks_for(n)
            more = max(0, self.blocks.blocks_for(n + self.round_rows) - take)
            if not self.blocks.can_allocate(take + more + ahead):
                break
            self.waiting.popleft()
            req.admitted(self._free_slots.pop(), self.blocks.allocate(take))
            admitted.append(req)
            tokens += n
            ahead += more
        self.running.extend(admitted)
        return admitted

    def _grow(self, decode: list[Request], rows: int, grown: list[Request]) -> bool:
        """Blocks for a step writing `rows` rows per request, oldest first, preempting the youngest
        running request while the pool is short. False: someone was preempted (re-plan the step)."""
        fits = self._take(decode, [self._shortfall(r, rows) for r in decode])
        if fits is not None:  # the common case: no preemption, no ordering
            grown.extend(fits)
            return True
        clean = True
        for req in sorted(decode, key=lambda r: r.index):
            if req not in self.running:
                continue
            need = self._shortfall(req, rows)
            while need > self.blocks.num_free:
                victim = max(self.running, key=lambda r: r.index)
                self.preempt(victim)
                clean = False
                if victim is req:
                    break
            if need and req in self.running:
                req.grew(self.blocks.allocate(need))
                grown.append(req)
        return clean

    def preempt(self, req: Request) -> None:
        """Free a running request's blocks and slot; it waits at the front, its tokens kept."""
        self.requeue(req)
        self.preemptions += 1

    def requeue(self, req: Request) -> None:
        self.running.remove(req)
        self._give_back(req)
        req.preempted()
        self.waiting.appendleft(req)

    def release(self, req: Request) -> None:
        """Drop a finished request from the queues and take back its blocks and slot."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self._give_back(req)

    def _give_back(self, req: Request) -> None:
        slot, blocks = req.released()
        if blocks:
            self.blocks.free(blocks)
        if slot >= 0:
            self._free_slots.append(slot)
