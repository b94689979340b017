"""Hedged verify, the round's one hook: plan, draft, verify chains beside the main spans (on scratch KV), pick
each request's winner and make its KV and feature rows canonical (docs/design/hedging.md, section 2)."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.hedge.auto import AutoHedge
from engine.hedge.chains import Candidate, effective_positions, plan_chains
from engine.hedge.scratch import ScratchKV
from engine.levers import Levers
from engine.request import Request
from engine.runner import ModelRunner, SpanResult

log = logging.getLogger(__name__)

# (span result, drafts of every row group, the groups' requests, their limits) -> host rows [n, d.., t..]
HostAccept = Callable[[SpanResult, torch.Tensor, list[Request], list[int]], list[list[int]]]


@dataclass
class Hedging:
    positions: tuple[int, ...]  # effective branch positions (the draft graph walks all of them)
    cap: int
    knee: int
    auto: AutoHedge | None


class Hedger:
    def __init__(self, runner: ModelRunner, scratch: ScratchKV | None, drafts_per_round: int):
        self.runner, self.scratch, self.per_round = runner, scratch, drafts_per_round
        self.on: Hedging | None = None
        self._said: set[str] = set()

    def _once(self, key: str, msg: str, *args) -> None:
        if key not in self._said:
            self._said.add(key)
            log.info(msg, *args)

    def configure(self, levers: Levers) -> None:
        """(Re)build the hedge state from the levers; a controller survives unless its range changes."""
        drafter = self.runner.drafter
        self.on = None
        if not levers.hedge or drafter is None:
            return
        if drafter.markov is None:
            self._once("no-markov", "hedge=%d has no effect: the drafter has no Markov head", levers.hedge)
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
            return
        if self.scratch is None:
            self._once(
                "no-scratch",
                "hedge=%d has no effect: no scratch KV was reserved at engine start (start the engine with the "
                "hedge on)",
                levers.hedge,
            )
            return
        auto = None
        if levers.hedge_auto:
            old = self._auto
            auto = old if old is not None and old.max_chains == len(positions) else AutoHedge(len(positions))
        self.on = Hedging(positions, levers.hedge, levers.hedge_knee, auto)
        self._once(
            f"on{positions}",
            "spec hedge on: up to %d request(s)/round, branch positions %s%s",
            levers.hedge,
            list(positions),
            " (auto chain count)" if auto else "",
        )

    @property
    def _auto(self) -> AutoHedge | None:
        return self.on.auto if self.on else None

    def pause(self) -> None:
        """A step that is no verify round ran (prefill, plain decode): no hedging sample."""
        if self._auto:
            self._auto.reanchor()

    def gated(self) -> None:
        """A gated round ran: it breaks the controller's window instead of being booked to C = 0."""
        if self._auto:
            self._auto.break_window()

    def plan(self, reqs: list[Request], limits: list[int], k: int) -> list[tuple[int, int]]:
        """(request index, branch index) of every chain this round verifies; [] when not hedging."""
        h = self.on
        if h is None:
            return []
        c = h.auto.chains() if h.auto else len(h.positions)
        positions = [p for p in h.positions[:c] if p < k]
        cands = [Candidate(r.params.greedy, lim) for r, lim in zip(reqs, limits, strict=True)]
        return plan_chains(cands, positions, 1 + k, h.cap, h.knee, self.scratch.chains)

    def draft(self, reqs: list[Request]) -> tuple[torch.Tensor, torch.Tensor]:
        """The main drafts [N, D] and every branch position's chain [N, P, D]."""
        return self.runner.draft_chains(reqs, self.on.positions)

    def verify(
        self,
        reqs: list[Request],
        plan: list[tuple[int, int]],
        drafted: tuple[torch.Tensor, torch.Tensor],
        k: int,
        limits: list[int],
        accept: HostAccept,
    ) -> tuple[SpanResult, list[list[int]], list[int]]:
        """The main spans plus each planned chain as extra row groups of one target forward (chain
        rows write scratch KV). Returns the result, host rows of every group (main groups first, then
        chains in plan order) and each request's winning group."""
        runner, n, span = self.runner, len(reqs), 1 + k
        full, chains = drafted
        owners = [reqs[i] for i, _ in plan]
        current = runner.field("token", n)[:, None]
        who = runner.to_device([i for i, _ in plan])
        chain_drafts = chains[who, runner.to_device([j for _, j in plan])][:, :k]
        drafts = torch.cat([full[:, :k], chain_drafts])
        ids = torch.cat([torch.cat([current, current[who]]), drafts], dim=1)
        rows = [r.slot for r in reqs] + self.scratch.prepare(owners, span)
        res = runner.span_rows(ids, rows, [r.num_kv for r in reqs] + [r.num_kv for r in owners])
        host = accept(res, drafts, [*reqs, *owners], limits + [limits[i] for i, _ in plan])
        best = list(range(n))
        for g, (i, _) in enumerate(plan, start=n):  # strictly more: ties keep the main chain
            if host[g][0] > host[best[i]][0]:
                best[i] = g
        return res, host, best

    def settle(
        self,
        reqs: list[Request],
        plan: list[tuple[int, int]],
        res: SpanResult,
        host: list[list[int]],
        best: list[int],
        kv_before: list[int],
        span: int,
    ) -> dict[int, tuple[int, int, int, int]]:
        """After the round committed each request's winning row: winners' KV and feature rows become
        canonical. Returns, per hedged request index, its trace fields (chains verified, the winner:
        0 = main, i = its i-th chain, main and winning chains' accepted drafts)."""
        n = len(reqs)
        mine: dict[int, list[int]] = {}
        for g, (i, _) in enumerate(plan, start=n):
            mine.setdefault(i, []).append(g)
        winners, keep, lines = [], [], {}
        for i, r in enumerate(reqs):
            g = best[i]
            if i in mine:
                lines[i] = (len(mine[i]), 0 if g == i else mine[i].index(g) + 1, host[i][0], host[g][0])
            if g == i or r.finished:
                continue
            rows = host[g][0] + 1  # [current, d1..dn] of the winning chain
            winners.append((g - n, r, kv_before[i], rows))
            keep += range(g * span, g * span + rows)
        if winners:
            self.scratch.commit(winners)
            feats = res.features.index_select(0, self.runner.to_device(keep))
            for (_, r, _, _), rows in zip(winners, feats.split([w[3] for w in winners]), strict=True):
                r.context_pending(rows)
        return lines

    def tick(self, plan: list[tuple[int, int]], committed: int) -> None:
        """Book a speculating round to the controller: the chains each hedged request ran."""
        if self._auto:
            self._auto.tick(max(Counter(i for i, _ in plan).values(), default=0), committed)
