"""The verify round for a batch: draft, hedge chains, one target forward, accept, commit, context.

SPEC 2.5 per request (see engine/spec.py); hedging (2.7) adds chain row groups to the same forward
and makes the winning chain's KV and feature rows canonical. Losers leave no trace: they wrote only
scratch KV, and only the winner's feature rows join the drafter context.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from engine.hedge import AutoHedge, Candidate, effective_positions, plan_chains
from engine.levers import Levers
from engine.request import Request
from engine.runner import ModelRunner, SpanResult
from engine.scratch import ScratchKV
from engine.spec import RoundOutcome, draft_limit, round_drafts, settle
from engine.trace import log_hedge, log_round

log = logging.getLogger(__name__)


@dataclass
class SpecStats:
    """Counters of the speculative path; rounds count request-rounds (one per request per verify)."""

    rounds: int = 0
    gated_rounds: int = 0
    draft_forwards: int = 0
    drafts: int = 0
    draft_tokens_verified: int = 0
    draft_tokens_accepted: int = 0
    committed_tokens: int = 0
    accepted_by_position: list[int] = field(default_factory=list)
    hedged_rounds: int = 0  # request-rounds that verified at least one chain
    hedge_chains: int = 0  # chains verified
    hedge_wins: int = 0  # request-rounds a chain won

    @property
    def tokens_per_round(self) -> float:
        """Mean committed tokens per speculating (non-gated) request-round."""
        spec = self.rounds - self.gated_rounds
        return (self.committed_tokens - self.gated_rounds) / spec if spec else 0.0


@dataclass
class Hedging:
    positions: tuple[int, ...]  # effective branch positions (the draft graph walks all of them)
    cap: int
    knee: int
    auto: AutoHedge | None


class Speculator:
    def __init__(
        self,
        runner: ModelRunner,
        drafts_per_round: int,
        sample: Callable,
        mark: Callable[[str], None],
        scratch: ScratchKV | None,
    ):
        self.runner, self.ops, self.per_round = runner, runner.ops, drafts_per_round
        self.sample, self.mark, self.scratch = sample, mark, scratch
        self.stats = SpecStats()
        self.hedging: Hedging | None = None
        self._warned: set[str] = set()

    def _once(self, key: str, msg: str, *args) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.info(msg, *args)

    def configure(self, levers: Levers) -> None:
        """(Re)build the hedge state from the levers; a controller survives unless its range changes."""
        drafter = self.runner.drafter
        if not levers.hedge or drafter is None:
            self.hedging = None
            return
        if drafter.markov is None:
            self._once(
                "no-markov", "hedge=%d has no effect: the drafter has no Markov head (markov_rank 0)", levers.hedge
            )
            self.hedging = None
            return
        positions = effective_positions(levers.hedge_positions, self.per_round)
        dropped = sorted(set(levers.hedge_positions) - set(positions))
        if dropped:
            self._once(
                f"dropped{dropped}",
                "hedge positions %s dropped: the drafter has %d draft positions",
                dropped,
                self.per_round,
            )
        if not positions:
            self.hedging = None
            return
        if self.scratch is None:
            self._once(
                "no-scratch",
                "hedge=%d has no effect: no scratch KV was reserved at engine start "
                "(start the engine with the hedge on)",
                levers.hedge,
            )
            self.hedging = None
            return
        auto = None
        if levers.hedge_auto:
            old = self.hedging.auto if self.hedging else None
            auto = old if old is not None and old.max_chains == len(positions) else AutoHedge(len(positions))
        self.hedging = Hedging(positions, levers.hedge, levers.hedge_knee, auto)
        self._once(
            f"on{positions}",
            "spec hedge on: up to %d request(s)/round, branch positions %s%s",
            levers.hedge,
            list(positions),
            " (auto chain count)" if auto else "",
        )

    def pause(self) -> None:
        """A non-speculative step ran (prefill or plain decode): its time is no hedging sample."""
        if self.hedging and self.hedging.auto:
            self.hedging.auto.reanchor()

    def _plan(self, reqs: list[Request], limits: list[int], k: int) -> list[tuple[int, int]]:
        h = self.hedging
        c = h.auto.chains() if h.auto else len(h.positions)
        positions = [p for p in h.positions[:c] if p < k]
        cands = [Candidate(r.params.greedy, lim) for r, lim in zip(reqs, limits, strict=True)]
        return plan_chains(cands, positions, 1 + k, h.cap, h.knee, self.scratch.chains)

    def gated_round(self, reqs: list[Request], levers: Levers) -> None:
        """A gated round (SPEC 2.4): the current token alone through the decode path, no drafter
        forward, booked like a plain decode step; the capture is kept (the forward stores each
        row's features as drafter context), so speculation can resume."""
        runner, n = self.runner, len(reqs)
        runner.stage(reqs)
        res = runner.decode(reqs)
        self.mark("target")
        tokens = self.sample(res.logits, res.greedy, [(r, 1) for r in reqs]).tolist()
        committed = 0
        for r, token in zip(reqs, tokens, strict=True):
            done = r.commit([token])
            committed += done
            if not r.finished:
                r.num_kv += 1
                r.draft_kv_len = r.num_kv
            if levers.trace:
                log_round(r.id, True, 0, 0, done, _draft_ctx(r), 0)
        s = self.stats
        s.rounds += n
        s.gated_rounds += n
        s.committed_tokens += committed
        if self.hedging and self.hedging.auto:
            self.hedging.auto.break_window()  # a gated round is no hedging sample

    def round(self, reqs: list[Request], levers: Levers) -> None:
        """One speculative round for the batch: draft, verify, accept, commit, context."""
        runner, n = self.runner, len(reqs)
        k = round_drafts(self.per_round, levers.max_drafts)
        span = 1 + k
        limits = [draft_limit(k, r.remaining) for r in reqs]
        runner.stage(reqs, limits)
        plan = self._plan(reqs, limits, k) if self.hedging else []
        if plan:
            full, chains = runner.draft_chains(reqs, self.hedging.positions)
        else:
            full, chains = runner.draft(reqs), None
        self.stats.draft_forwards += 1
        self.mark("draft")
        if plan:
            owners = [reqs[i] for i, _ in plan]
            res, drafts = self._hedged_verify(reqs, owners, full[:, :k], chains[:, :, :k], plan, span)
            host = self._accept(res, drafts, [*reqs, *owners], limits + [limits[i] for i, _ in plan])
        else:
            res, rounds = runner.verify(reqs, full, k)
            self.mark("target")
            if all(r.params.greedy for r in reqs):
                host = rounds.tolist()  # accepted on the device against the greedy targets
            else:
                host = self._accept(res, full[:, :k], reqs, limits)
        chains_of: dict[int, list[int]] = {}
        for m, (i, _) in enumerate(plan):
            chains_of.setdefault(i, []).append(n + m)
        keep: list[int] = []
        grown: list[tuple[Request, int]] = []
        winners: list[tuple[int, Request, int, int]] = []
        outcomes: list[RoundOutcome] = []
        bests: list[int] = []
        wins = 0
        for i, r in enumerate(reqs):
            mine = chains_of.get(i, ())
            best = i
            for g in mine:  # strictly more: ties keep the main chain
                if host[g][0] > host[best][0]:
                    best = g
            row, before = host[best], r.num_kv
            outcome = settle(r, row[1 : 1 + k], row[1 + k :], row[0], limits[i])
            outcomes.append(outcome)
            bests.append(best)
            wins += best != i
            if r.finished:
                continue
            if best == i:  # the verify stored the main span's rows as drafter context
                r.draft_kv_len = r.num_kv
            else:  # a chain's rows join the context at the next draft, over the main span's
                winners.append((best - n, r, before, outcome.accepted_draft + 1))
                keep += range(best * span, best * span + outcome.accepted_draft + 1)
                grown.append((r, outcome.accepted_draft + 1))
        self._count(outcomes, sum(len(v) for v in chains_of.values()), len(chains_of), wins)
        if winners:
            self.scratch.commit(winners)
            self._append_context(res.features, keep, grown)
        if levers.trace:  # after the context is appended: draft_ctx counts a winning chain's rows
            for i, (r, outcome) in enumerate(zip(reqs, outcomes, strict=True)):
                log_round(
                    r.id, False, outcome.verified_draft, outcome.accepted_draft, outcome.committed, _draft_ctx(r), k
                )
                mine, best = chains_of.get(i, ()), bests[i]
                if mine:
                    winner = 0 if best == i else mine.index(best) + 1
                    log_hedge(r.id, len(mine), winner, host[i][0], host[best][0])
        if self.hedging and self.hedging.auto:
            committed = sum(o.committed for o in outcomes)
            self.hedging.auto.tick(max((len(v) for v in chains_of.values()), default=0), committed)

    def _hedged_verify(
        self,
        reqs: list[Request],
        owners: list[Request],
        drafts: torch.Tensor,
        chains: torch.Tensor,
        plan: list[tuple[int, int]],
        span: int,
    ) -> tuple[SpanResult, torch.Tensor]:
        """Main spans plus each planned chain (request i, branch j; owners[m] = reqs[i]) as extra row groups of one
        target forward; chain rows verify into scratch KV. Returns the result and every group's drafts."""
        runner, n = self.runner, len(reqs)
        current = runner.field("token", n)[:, None]
        who = runner._tensor([i for i, _ in plan])
        chain_drafts = chains[who, runner._tensor([j for _, j in plan])]
        ids = torch.cat([torch.cat([current, drafts], dim=1), torch.cat([current[who], chain_drafts], dim=1)])
        rows = [r.slot for r in reqs] + self.scratch.prepare(owners, span)
        num_kv = [r.num_kv for r in reqs] + [r.num_kv for r in owners]
        res = runner.extend_rows(ids, rows, num_kv)
        self.mark("target")
        return res, torch.cat([drafts, chain_drafts])

    def _accept(
        self, res: SpanResult, drafts: torch.Tensor, groups: list[Request], limits: list[int]
    ) -> list[list[int]]:
        """Targets sampled per span row (greedy or seeded), then the accepted prefix of each group:
        rows [accepted n, d1..dk, targets] on the host."""
        k = drafts.shape[1]
        targets = self.sample(res.logits, res.greedy, [(r, 1 + k) for r in groups]).view(len(groups), 1 + k)
        accepted = self.ops.accept_prefix(drafts, targets, self.runner._tensor(limits))
        return torch.cat([accepted[:, None], drafts, targets], dim=1).tolist()

    def _append_context(self, features: torch.Tensor, keep: list[int], grown: list[tuple[Request, int]]) -> None:
        """Feature rows of each winning chain's [current, d1..dn] join its request's pending drafter
        context; copied out of the (graph-owned) output buffer in one gather."""
        rows = features.index_select(0, self.runner._tensor(keep))
        for (r, _), mine in zip(grown, rows.split([count for _, count in grown]), strict=True):
            r.ctx_pending.append(mine)

    def _count(self, outcomes: list[RoundOutcome], chains: int, hedged: int, wins: int) -> None:
        """Book one round's request-rounds (chains verified, requests hedged, chain wins) in bulk."""
        s = self.stats
        n = len(outcomes)
        s.rounds += n
        s.committed_tokens += sum(o.committed for o in outcomes)
        s.hedged_rounds += hedged
        s.hedge_chains += chains
        s.hedge_wins += wins
        s.drafts += n
        s.draft_tokens_verified += sum(o.verified_draft for o in outcomes)
        accepted = Counter(o.accepted_draft for o in outcomes)
        s.draft_tokens_accepted += sum(a * c for a, c in accepted.items())
        by_pos = s.accepted_by_position
        if len(by_pos) < self.per_round:
            by_pos += [0] * (self.per_round - len(by_pos))
        more = 0  # request-rounds that accepted more than pos drafts
        for pos in range(max(accepted, default=0) - 1, -1, -1):
            more += accepted.get(pos + 1, 0)
            by_pos[pos] += more


def _draft_ctx(r: Request) -> int:
    """Drafter context rows a request holds: stored in the drafter cache plus pending."""
    return r.draft_kv_len + sum(t.shape[0] for t in r.ctx_pending)
