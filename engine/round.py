"""The decode-side rounds (SPEC 2.4, 2.5; docs/architecture.md, "Walk of one step"): the one-token round
(plain decode drops the drafter state; a gated round keeps the capture, traced and counted) and the
speculative round: k drafts (the span choice's; 0 runs the gated round) verified as [current, d1..dk] in
one target forward, n <= `draft_limit` accepted, d1..dn plus the target's bonus token committed; hedging
(engine/hedge) adds chains to the verify and picks each request's winner."""

from __future__ import annotations

from functools import partial
from itertools import accumulate

import torch

from engine.decode_overlap import HostTokens, OverlappedDecode, TakeBlocks
from engine.hedge import Hedger
from engine.levers import Levers
from engine.logprobs import record_logprobs
from engine.policy.choice import AdaptiveSpans, StaticSpans
from engine.policy.costs import CostTable
from engine.policy.span import SpanPolicy, check_table
from engine.ragged import ragged_verify
from engine.request import Request
from engine.runner import ModelRunner, SpanResult
from engine.sampler import sample_requests
from engine.spec_stats import RoundOutcome, SpecStats
from engine.staging import draft_limit
from engine.timing import PhaseTimer
from engine.trace import log_hedge, log_round


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
        trace: bool,
        cost_table: CostTable | None = None,
        overlap: bool = True,
        take_blocks: TakeBlocks | None = None,
    ):
        self.runner, self.per_round, self.hedger, self.trace = runner, drafts_per_round, hedger, trace
        self.cost_table = cost_table
        self.learn_host = cost_table is None  # a table given at start is taken as the whole cost
        self.accept = partial(accept_rows, runner.ops.accept_prefix)  # one object: one verify graph per k
        self.stats = SpecStats()
        self.timer: PhaseTimer | None = None  # benchmarks set one to get per-step phase times
        self.static = StaticSpans(drafts_per_round)
        self.adaptive: AdaptiveSpans | None = None  # made once; its estimate outlives lever changes
        self.overlap = OverlappedDecode(runner, overlap, take_blocks)  # plain decode's next step launched ahead
        self.spans: StaticSpans | AdaptiveSpans = self.static

    def configure(self, levers: Levers) -> None:
        """Take these levers; refused (nothing changed) when the adaptive policy has no cost table.
        Without a drafter the policy has nothing to choose and needs none."""
        adaptive = levers.policy != "static" and self.per_round
        if adaptive and self.cost_table is None:
            raise ValueError("policy=adaptive needs a cost table (EngineConfig.cost_table)")
        self.overlap.drop()  # launched under the old levers
        self.hedger.configure(levers)
        if adaptive and self.adaptive is None:
            self.adaptive = AdaptiveSpans(SpanPolicy(self.cost_table, self.per_round, learn_host=self.learn_host))
            self.adaptive.padded = self.runner.graphs.enabled
        self.spans = self.adaptive if adaptive else self.static
        self.spans.configure(levers)

    @property
    def policy(self) -> SpanPolicy | None:
        """The adaptive policy's state while the levers ask for it (benches and tests read it)."""
        return self.spans.policy

    def set_cost_table(self, table: CostTable) -> None:
        """The adaptive policy's cost table, measured on this device: the policy learns the host time
        the table misses and keeps its acceptance estimate."""
        if self.per_round:
            check_table(table)
        self.cost_table, self.learn_host = table, True
        if self.adaptive is not None:
            self.adaptive.set_table(table)

    def step_wall(self, batch: int, ms: float | None) -> None:
        """The engine's wall for the step that ran the last decode-side round (None: it captured a graph)."""
        self.spans.wall(batch, ms)

    def pause(self) -> None:
        """A prefill ran: no hedging sample."""
        self.hedger.pause()

    def _mark(self, phase: str) -> None:
        if self.timer:
            self.timer.mark(phase)

    # -- the one-token round ---------------------------------------------------------------------------
    def one_token(self, reqs: list[Request], gated: bool, draining: bool | None = None, admitting: bool = True) -> None:
        """Plain decode (gated False) or a gated round (gated True: capture kept, traced, counted).
        draining: given where the span choice gated the round (it plans the next one meanwhile). admitting:
        the next step could be a prefill, so none is launched ahead (engine/decode_overlap.py)."""
        committed = self._one_step(reqs, gated, draining, admitting)
        if not gated:
            self.hedger.pause()
            self.spans.settled(None, reqs)
            return
        self.stats.count_gated(committed)
        if self.trace:
            for r, done in zip(reqs, committed, strict=True):
                log_round(r.id, True, 0, 0, done, r.draft_context_len, 0)
        self.hedger.gated()
        self.spans.settled(0, reqs)

    def _one_step(self, reqs: list[Request], gated: bool, draining: bool | None, admitting: bool) -> list[int]:
        """This step (the one launched ahead if it is this one, else launched now), then, where it may,
        the next one launched before this one's tokens are read; the tokens each request committed."""
        launched = self.overlap.take(reqs, gated)
        if launched is None:
            self.runner.stage(reqs)
            res = self.runner.decode(reqs)
        if draining is not None:  # the policy chose this gated round: it plans the next one meanwhile
            self.spans.launched(reqs, draining, None)
        # A gated round launches its successor only where that is a gated round of the same requests.
        ahead = (not gated or self.spans.gates_next(reqs)) and self.overlap.eligible(reqs, admitting)
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
        admitting: as one_token's (no round launches ahead), also for the gated round the policy may choose."""
        chosen = self.spans.choose(reqs, draining)
        ks = [chosen] * len(reqs) if isinstance(chosen, int) else chosen
        k = max(ks)
        if k == 0:
            self.one_token(reqs, gated=True, draining=draining, admitting=admitting)
            return
        # Only a uniform unhedged round launches its successor ahead, or uses one launched.
        uniform = isinstance(chosen, int) and self.hedger.on is None
        launched = self.overlap.take(reqs, False, k) if uniform else None
        if not uniform:
            self.overlap.drop()
        limits = [draft_limit(ki, r.remaining) for ki, r in zip(ks, reqs, strict=True)]
        if launched is None:
            plan, res, rows, best, starts, k = self._launch(reqs, ks, limits, draining)
            device_rows = rows if isinstance(rows, torch.Tensor) else None  # accepted on the device
        else:  # its device span: from the previous round's rows copy to its own
            plan, res, rows, best, starts = [], launched.result, launched.tokens, launched.index, 1 + k
            device_rows = launched.device_tokens
            self.spans.launched(reqs, draining, limits)
            if self.timer:
                self.timer.span("draft", launched.after.ready, launched.drafted)
                self.timer.span("target", launched.drafted, rows.ready)
        after = self.spans.next_k(reqs, draining) if device_rows is not None and uniform else 0
        if after and self.overlap.eligible(reqs, admitting, k):
            if launched is None:
                rows = HostTokens.copy(device_rows)
            self.overlap.launch_round(reqs, device_rows, rows, after, self.accept, best)
        if not isinstance(rows, list):
            rows = rows.tolist()
        kv_before = [r.num_kv for r in reqs]
        outcomes = [settle(r, rows[best[i]], k, limits[i]) for i, r in enumerate(reqs)]
        self.overlap.settled(reqs)
        self.spans.settled(max(ks), reqs, limits, [o.accepted_draft for o in outcomes])
        record_logprobs(reqs, res.logits, starts, [o.committed for o in outcomes], best)
        hedges = self.hedger.settle(reqs, plan, res, rows, best, kv_before, 1 + k) if plan else {}
        if self.trace:  # a request's hedge line follows its round line
            for i, (r, o) in enumerate(zip(reqs, outcomes, strict=True)):
                log_round(r.id, False, o.verified_draft, o.accepted_draft, o.committed, r.draft_context_len, ks[i])
                if i in hedges:
                    log_hedge(r.id, *hedges[i])
        wins = sum(h[1] != 0 for h in hedges.values())
        self.stats.count_round(outcomes, len(plan), len(hedges), wins, self.per_round)
        self.hedger.tick(plan, sum(o.committed for o in outcomes))

    def _launch(self, reqs: list[Request], ks: list[int], limits: list[int], draining: bool) -> tuple:
        """Draft and verify this round: (hedge plan, span result, accept rows: on the device where every
        request is greedy and unhedged, else host lists, each request's row index, its first span rows
        (logprobs), the rows' draft width)."""
        runner, k = self.runner, max(ks)
        self._store_pending_context(reqs)
        runner.stage(reqs, limits)
        plan = self.hedger.plan(reqs, limits, k)
        ragged = not plan and min(ks) != k  # a hedged round verifies 1 + k rows each, its limits <= K_i
        starts: int | list[int] = 1 + k
        if plan:
            drafted = self.hedger.draft(reqs)
            self._mark("draft")
            res, rows, best = self.hedger.verify(reqs, plan, drafted, k, limits, self._accept_on_host)
            self._mark("target")
            return plan, res, rows, best, starts, k
        drafts = runner.draft(reqs, k)  # the head over max K_i (a ragged round's too: the chooser's drafter ms)
        self._mark("draft")
        if ragged:
            out, rows, starts = ragged_verify(runner, reqs, drafts, ks, self.accept)
            res = SpanResult(*out)
        else:
            res, rows = runner.verify(reqs, drafts, k, self.accept)
        self.spans.launched(reqs, draining, limits)
        self._mark("target")
        k = rows.shape[1] // 2 - 1  # the rows' draft width (a ragged verify's: drafts per round)
        if not all(r.params.greedy for r in reqs):
            drafts = torch.nn.functional.pad(drafts, (0, k - drafts.shape[1]))[:, :k]
            rows = self._accept_on_host(res, drafts, reqs, limits, ks if ragged else None)
        return plan, res, rows, list(range(len(reqs))), starts, k

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
        self, res: SpanResult, drafts: torch.Tensor, groups: list[Request], limits: list[int], ks=None
    ) -> list[list[int]]:
        """The accept rule on targets sampled per span row (greedy or seeded). ks: a ragged verify's
        drafts per request (its targets past a span repeat the span's last, as on the device)."""
        k = drafts.shape[1]
        if ks is None:
            targets = sample_requests(res.logits, res.greedy, groups, 1 + k, drafts)
        else:
            flat = sample_requests(res.logits, res.greedy, groups, [1 + ki for ki in ks], drafts)
            firsts = accumulate([1 + ki for ki in ks], initial=0)
            targets = flat[
                self.runner.to_device([a + min(j, ki) for a, ki in zip(firsts, ks, strict=False) for j in range(1 + k)])
            ]
        return self.accept(drafts, targets.view(len(groups), 1 + k), self.runner.to_device(limits)).tolist()
