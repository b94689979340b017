"""The decode-side rounds, top to bottom (SPEC 2.4, 2.5): the one-token round and the speculative round.

One-token round: each request's current token through the target (the plain decode step). A gated
round (the batch is at or above MAX_BATCH) is the same step that keeps the capture: the forward
stored each row's features as drafter context, so speculation resumes once the batch shrinks. A
plain decode (no drafter, or a request not draft-ready) drops the drafter state and writes no trace.

Speculative round, per request: k drafts enter the verify (MAX_DRAFTS trims them), a request may
accept at most `draft_limit` of them (its budget), the target verifies [current, d1..dk] in one
forward, n = the longest accepted prefix, commit d1..dn plus the target's token after dn (the bonus).
Hedging hooks in at one place: it drafts chains, verifies them with the main spans, and picks the
winner (engine/hedge/hedger.py). Under the adaptive policy (engine/policy.py) k is the policy's
choice for the round; k = 0 runs the gated one-token round instead.
"""

from __future__ import annotations

from functools import partial

import torch

from engine.costs import CostTable
from engine.decode_overlap import HostTokens, OverlappedDecode, TakeBlocks
from engine.hedge import Hedger
from engine.levers import Levers
from engine.logprobs import record_logprobs
from engine.policy import SpanPolicy
from engine.policy_ahead import PolicyAhead, ahead_key
from engine.request import Request
from engine.runner import ModelRunner, SpanResult
from engine.sampler import sample_requests
from engine.spec_stats import RoundOutcome, SpecStats
from engine.timing import PhaseTimer
from engine.trace import log_hedge, log_round


def round_drafts(drafts_per_round: int, max_drafts: int) -> int:
    """k: drafts entering a speculative round's verify, uniform across the batch (span = 1 + k);
    max_drafts 0 = no trim."""
    return min(drafts_per_round, max_drafts) if max_drafts else drafts_per_round


def draft_limit(k: int, remaining: int) -> int:
    """Drafts a request may accept: its budget left minus the bonus token, so a round never
    overshoots max_tokens."""
    return max(0, min(k, remaining - 1))


def accept_rows(accept_prefix, drafts: torch.Tensor, targets: torch.Tensor, limits: torch.Tensor) -> torch.Tensor:
    """The accept rule, one for both forms: n = the longest prefix (<= limit) with d_{i+1} ==
    targets[i]; rows [n, d1..dk, targets t0..tk]. Device form: inside the verify graph on the greedy
    targets (every request greedy). Host form: `Rounds._accept_on_host`, on sampled targets."""
    n = accept_prefix(drafts, targets, limits)
    return torch.cat([n[:, None], drafts, targets], dim=1)


def settle(req: Request, row: list[int], k: int, limit: int) -> RoundOutcome:
    """Commit one request's accepted drafts plus the bonus from its accept row [n, d1..dk, t0..tk].
    A stop token inside the run ends the request there; what follows is rolled back like a rejection."""
    accepted, drafts, targets = row[0], row[1 : 1 + k], row[1 + k :]
    if not 0 <= accepted <= limit <= k:
        raise ValueError(f"{req.id}: accepted {accepted} outside [0, limit {limit}] of {k} drafts")
    committed = req.advanced(drafts[:accepted], targets[accepted], keep_context=True)
    return RoundOutcome(verified_draft=limit, accepted_draft=accepted, committed=committed)


class Rounds:
    def __init__(
        self,
        runner: ModelRunner,
        drafts_per_round: int,
        hedger: Hedger,
        levers: Levers,
        trace: bool,
        cost_table: CostTable | None = None,
        overlap: bool = True,
        take_blocks: TakeBlocks | None = None,
    ):
        self.runner, self.per_round, self.hedger, self.trace = runner, drafts_per_round, hedger, trace
        self.cost_table, self._span_policy = cost_table, None
        self.learn_host = cost_table is None  # a table given at start is taken as the whole cost
        self.accept = partial(accept_rows, runner.ops.accept_prefix)  # one object: one verify graph per k
        self.stats = SpecStats()
        self.timer: PhaseTimer | None = None  # benchmarks set one to get per-step phase times
        self._policy_k: int | None = None  # the K the policy's last round ran at, until its wall arrives
        self.ahead = PolicyAhead()  # the policy's host work while the device runs a round
        self.overlap = OverlappedDecode(runner, overlap, take_blocks)  # plain decode's next step launched ahead
        self.configure(levers)

    def configure(self, levers: Levers) -> None:
        """Take these levers; refused (nothing changed) when the adaptive policy has no cost table.
        Without a drafter the policy has nothing to choose and needs none."""
        if levers.policy == "adaptive" and self.per_round and self.cost_table is None:
            raise ValueError("policy=adaptive needs a cost table (EngineConfig.cost_table)")
        self.levers = levers
        self.ahead.drop()
        self.hedger.configure(levers)
        if levers.policy == "adaptive" and self.per_round and self._span_policy is None:
            self._span_policy = SpanPolicy(self.cost_table, self.per_round, learn_host=self.learn_host)

    @property
    def policy(self) -> SpanPolicy | None:
        """The adaptive policy while the levers ask for it. Its acceptance estimate outlives lever
        changes: it describes the workload, and a policy restarted from its optimistic seed at batch 256
        spent its first rounds at K=15 (the H200 study's adaptive arm, re-created at every arm switch)."""
        return self._span_policy if self.levers.policy == "adaptive" else None

    def set_cost_table(self, table: CostTable) -> None:
        """The adaptive policy's cost table, measured on this device (refused, nothing changed, when the
        policy cannot use it): the policy learns the host time it misses. A policy already made keeps
        its acceptance estimate on the new table."""
        policy = SpanPolicy(table, self.per_round) if self.per_round else None
        self.cost_table, self.learn_host = table, True
        self.ahead.drop()
        self.ahead.flush(self._span_policy)
        if self._span_policy is not None and policy is not None:
            policy.conditional = list(self._span_policy.conditional)
            self._span_policy = policy

    def step_wall(self, batch: int, ms: float | None) -> None:
        """The engine's wall for the step that ran the last round (None: it captured a graph): the
        policy's host term learns from it (nothing to learn for a plain step or a prefill)."""
        k, self._policy_k = self._policy_k, None
        if k is not None and ms is not None and self.policy:
            self.policy.observe_wall(batch, k, ms)

    def pause(self) -> None:
        """A prefill ran: no hedging sample."""
        self.hedger.pause()

    def _mark(self, phase: str) -> None:
        if self.timer:
            self.timer.mark(phase)

    # -- the one-token round ---------------------------------------------------------------------------
    def one_token(self, reqs: list[Request], gated: bool, draining: bool | None = None, admitting: bool = True) -> None:
        """Plain decode (gated False) or a gated round (gated True: capture kept, traced, counted).
        draining: given where the adaptive policy gated the round (PolicyAhead.after_gated). admitting:
        the next step could be a prefill, so none is launched ahead (engine/decode_overlap.py)."""
        committed = self._one_step(reqs, gated, draining, admitting)
        if not gated:
            self.hedger.pause()
            self._policy_k = None
            return
        self.stats.count_gated(committed)
        if self.trace:
            for r, done in zip(reqs, committed, strict=True):
                log_round(r.id, True, 0, 0, done, r.draft_context_len, 0)
        self.hedger.gated()
        if self.policy:
            self.ahead.flush(self.policy)
            self.policy.gated()
            self._policy_k = 0

    def _one_step(self, reqs: list[Request], gated: bool, draining: bool | None, admitting: bool) -> list[int]:
        """This step (the one launched ahead if it is this one, else launched now), then, where it may,
        the next one launched before this one's tokens are read; the tokens each request committed."""
        launched = self.overlap.take(reqs, gated)
        if launched is None:
            self.runner.stage(reqs)
            res = self.runner.decode(reqs)
        if draining is not None:  # the adaptive policy plans the next round while this one runs
            self.ahead.after_gated(self.policy, reqs, self.levers, draining)
        # Under the adaptive policy a gated round launches its successor where that plan gates them again.
        next_gated = not (gated and self.policy) or (draining is not None and self.ahead.gates(reqs))
        ahead = next_gated and self.overlap.eligible(reqs, admitting)
        if launched is None:
            self._mark("target")
            if not ahead:
                tokens = sample_requests(res.logits, res.greedy, reqs, 1).tolist()
                committed = [r.advanced([], t, keep_context=gated) for r, t in zip(reqs, tokens, strict=True)]
                record_logprobs(reqs, res.logits, 1, committed)
                return committed
            this, device_tokens = HostTokens.copy(res.greedy), res.greedy
        else:  # its device span: from the previous step's token copy to its own
            this, device_tokens = launched.tokens, launched.device_tokens
            if self.timer:
                self.timer.span("target", launched.after.ready, this.ready)
        if ahead:
            self.overlap.launch(reqs, device_tokens, this, gated)
        return [r.advanced([], t, keep_context=gated) for r, t in zip(reqs, this.tolist(), strict=True)]

    # -- the speculative round -------------------------------------------------------------------------
    def speculate(self, reqs: list[Request], draining: bool = False, admitting: bool = True) -> None:
        """draining: no request waits for a slot, so the adaptive policy values K over the wave.
        admitting: as one_token's, for the gated round the policy may choose."""
        runner, lv = self.runner, self.levers
        if self.policy is None:
            k = round_drafts(self.per_round, lv.max_drafts)
        else:
            k = self.ahead.take(self.policy, reqs, ahead_key(lv, draining))
            if k is None:
                remaining = [r.remaining for r in reqs]  # one pass: at batch 256 each is ~20 us of a gated round
                k = self.policy.decide(
                    len(reqs), lv.max_drafts, lv.max_batch, remaining if draining else None, max(remaining) - 1
                )
            if k == 0:
                self.one_token(reqs, gated=True, draining=draining, admitting=admitting)
                return
        limits = [draft_limit(k, r.remaining) for r in reqs]
        self._store_pending_context(reqs)
        runner.stage(reqs, limits)
        plan = self.hedger.plan(reqs, limits, k)
        if plan:
            drafted = self.hedger.draft(reqs)
            self._mark("draft")
            res, rows, best = self.hedger.verify(reqs, plan, drafted, k, limits, self._accept_on_host)
            self._mark("target")
        else:
            drafts = runner.draft(reqs)
            self._mark("draft")
            res, device_rows = runner.verify(reqs, drafts, k, self.accept)
            if self.policy:
                self.ahead.after_verify(self.policy, reqs, limits, lv, draining)
            self._mark("target")
            greedy = all(r.params.greedy for r in reqs)
            rows = device_rows.tolist() if greedy else self._accept_on_host(res, drafts[:, :k], reqs, limits)
            best = list(range(len(reqs)))
        kv_before = [r.num_kv for r in reqs]
        outcomes = [settle(r, rows[best[i]], k, limits[i]) for i, r in enumerate(reqs)]
        if self.policy:
            self.ahead.observed(limits, [o.accepted_draft for o in outcomes])
            self._policy_k = k
        record_logprobs(reqs, res.logits, 1 + k, [o.committed for o in outcomes], best)
        hedges = self.hedger.settle(reqs, plan, res, rows, best, kv_before, 1 + k) if plan else {}
        if self.trace:  # a request's hedge line follows its round line
            for i, (r, o) in enumerate(zip(reqs, outcomes, strict=True)):
                log_round(r.id, False, o.verified_draft, o.accepted_draft, o.committed, r.draft_context_len, k)
                if i in hedges:
                    log_hedge(r.id, *hedges[i])
        wins = sum(h[1] != 0 for h in hedges.values())
        self.stats.count_round(outcomes, len(plan), len(hedges), wins, self.per_round)
        self.hedger.tick(plan, sum(o.committed for o in outcomes))

    def _store_pending_context(self, reqs: list[Request]) -> None:
        """Rows a winning hedge chain handed over last round join the drafter's KV before it drafts."""
        feats, positions, slots, owners = [], [], [], []
        for r in reqs:
            if r.ctx_pending:
                span = range(r.draft_kv_len, r.num_kv)
                feats += r.ctx_pending
                positions += span
                slots += self.runner.slots(r, span)
                owners.append(r)
        if feats:
            self.runner.store_context(torch.cat(feats), positions, slots)
            for r in owners:
                r.context_flushed()

    def _accept_on_host(
        self, res: SpanResult, drafts: torch.Tensor, groups: list[Request], limits: list[int]
    ) -> list[list[int]]:
        """The accept rule on targets sampled per span row (greedy or seeded): rows on the host."""
        k = drafts.shape[1]
        targets = sample_requests(res.logits, res.greedy, groups, 1 + k, drafts).view(len(groups), 1 + k)
        return self.accept(drafts, targets, self.runner.to_device(limits)).tolist()
