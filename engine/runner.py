"""Executing a step on the device: prefill, uniform spans (decode / verify), drafter forwards, CUDA graphs.

A span step with N row groups and S rows each is replayed from a CUDA graph captured for exactly
(bucket(N), S): inputs are padded to the bucket with rows that point at the null block. Any other
shape runs eagerly; a graph is never replayed for a shape it was not captured at. Hedge chains are
extra row groups of the same span with block-table rows of their own (after the null row), so a
hedged verify is one more span step of the same shape family; the draft graph is keyed on the
branch positions it walks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import torch

from engine.kv_cache import allocate_kv_cache
from engine.models.dflash import DFlashDrafter
from engine.models.layers import AttnMeta
from engine.models.markov import markov_walk
from engine.models.qwen3 import Qwen3ForCausalLM
from engine.request import Request

log = logging.getLogger(__name__)


def batch_buckets(max_num_seqs: int) -> list[int]:
    sizes = [b for b in (1, 2, 4, 8) if b < max_num_seqs] + list(range(16, max_num_seqs, 8))
    return sorted(set(sizes + [max_num_seqs]))


@dataclass
class SpanResult:
    logits: torch.Tensor  # [N * S, V]
    greedy: torch.Tensor  # [N * S] int64
    features: torch.Tensor | None  # [N * S, n_taps * H]


class _Graph:
    """One captured step: static inputs are copied in, the graph replayed, static outputs read."""

    def __init__(self, fn: Callable[..., tuple], inputs: dict[str, torch.Tensor], pool):
        self.inputs = inputs
        fn(**inputs)  # compiles and autotunes kernels outside the capture
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.outputs = fn(**inputs)

    def replay(self, **values: torch.Tensor) -> tuple:
        for name, value in values.items():
            self.inputs[name].copy_(value, non_blocking=True)
        self.graph.replay()
        return self.outputs


class ModelRunner:
    def __init__(
        self,
        target: Qwen3ForCausalLM,
        drafter: DFlashDrafter | None,
        *,
        num_blocks: int,
        block_size: int,
        max_num_seqs: int,
        max_blocks_per_seq: int,
        use_graphs: bool,
        chain_rows: int = 0,
    ):
        self.target, self.drafter = target, drafter
        self.device, self.dtype, self.ops = target.device, target.dtype, target.ops
        self.block_size = block_size
        g = target.g
        self.kv = allocate_kv_cache(
            g.num_layers, num_blocks, block_size, g.num_kv_heads, g.head_dim, self.dtype, self.device
        )
        self.draft_kv = []
        self.taps: tuple[int, ...] = ()
        if drafter is not None:
            dg = drafter.g
            self.draft_kv = allocate_kv_cache(
                dg.num_layers, num_blocks, block_size, dg.num_kv_heads, dg.head_dim, self.dtype, self.device
            )
            self.taps = drafter.cfg.target_layer_ids
            # A verify commits at most drafts_per_round + 1 rows, all of which join the context.
            self.ctx_rows = drafter.cfg.drafts_per_round + 1
        # One row per request slot, a null row (all block 0) for padded rows, then one per hedge chain.
        self.block_tables = torch.zeros(
            max_num_seqs + 1 + chain_rows, max_blocks_per_seq, dtype=torch.int32, device=self.device
        )
        self.null_row = max_num_seqs
        self.chain_row0 = max_num_seqs + 1
        self.buckets = sorted(set(batch_buckets(max_num_seqs + chain_rows)) | {max_num_seqs})
        self.use_graphs = use_graphs
        self.graphs: dict[tuple, _Graph] = {}
        self._pool = torch.cuda.graph_pool_handle() if use_graphs else None

    # -- host -> device -----------------------------------------------------------------------------
    def _tensor(self, values: list[int], dtype: torch.dtype = torch.int64) -> torch.Tensor:
        if self.device.type == "cuda":
            return torch.tensor(values, dtype=dtype, pin_memory=True).to(self.device, non_blocking=True)
        return torch.tensor(values, dtype=dtype, device=self.device)

    def assign_blocks(self, req: Request) -> None:
        row = torch.zeros(self.block_tables.shape[1], dtype=torch.int32)
        row[: len(req.blocks)] = torch.tensor(req.blocks, dtype=torch.int32)
        self.block_tables[req.slot].copy_(row)

    def _slots(self, req: Request, positions: range) -> list[int]:
        bs = self.block_size
        return [req.blocks[p // bs] * bs + p % bs for p in positions]

    # -- device-side index math (graph-safe) --------------------------------------------------------
    def _span_meta(self, rows: torch.Tensor, num_kv: torch.Tensor, span: int, causal: bool):
        n = rows.shape[0]
        positions = num_kv[:, None] + torch.arange(span, device=self.device)[None, :]
        tables = self.block_tables.index_select(0, rows)
        blocks = tables.gather(1, positions // self.block_size).long()
        slots = (blocks * self.block_size + positions % self.block_size).reshape(-1)
        qsl = torch.arange(n + 1, dtype=torch.int32, device=self.device) * span
        meta = AttnMeta(slots, tables, (num_kv + span).to(torch.int32), qsl, span, causal)
        return positions.reshape(-1), meta

    def _bucket(self, n: int) -> int | None:
        if not self.use_graphs:
            return None
        return next((b for b in self.buckets if b >= n), None)

    def _run(self, key: tuple, fn: Callable[..., tuple], n: int, values: dict[str, torch.Tensor], pads: dict) -> tuple:
        """Eager, or the graph captured for exactly this (kind, bucket, shape)."""
        bucket = self._bucket(n)
        if bucket is None:
            return fn(**values)
        if bucket > n:
            values = {
                k: torch.cat([v, torch.full((bucket - n, *v.shape[1:]), pads[k], dtype=v.dtype, device=v.device)])
                for k, v in values.items()
            }
        key = (*key, bucket)
        graph = self.graphs.get(key)
        if graph is None:
            log.debug("capturing CUDA graph %s", key)
            graph = self.graphs[key] = _Graph(fn, {k: v.clone() for k, v in values.items()}, self._pool)
        return graph.replay(**values)

    # -- target ------------------------------------------------------------------------------------
    def prefill(self, reqs: list[Request]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Whole prompts, eagerly. Returns logits and argmax at each prompt's last row, and feature
        rows for every prompt row when a drafter is loaded."""
        ids, positions, slots, starts = [], [], [], [0]
        for r in reqs:
            n = len(r.prompt_ids)
            ids += r.prompt_ids
            positions += range(n)
            slots += self._slots(r, range(n))
            starts.append(starts[-1] + n)
        rows = self._tensor([r.slot for r in reqs])
        meta = AttnMeta(
            self._tensor(slots),
            self.block_tables.index_select(0, rows),
            self._tensor([len(r.prompt_ids) for r in reqs], torch.int32),
            self._tensor(starts, torch.int32),
            max(len(r.prompt_ids) for r in reqs),
            causal=True,
        )
        features = self._features(len(ids))
        hidden = self.target.forward(self._tensor(ids), self._tensor(positions), meta, self.kv, self.taps, features)
        last = hidden.index_select(0, self._tensor(starts[1:]) - 1)
        logits = self.target.logits(last)
        return logits, self.ops.argmax(logits), features

    def _features(self, rows: int) -> torch.Tensor | None:
        if not self.taps:
            return None
        return torch.empty(rows, self.drafter.cfg.feature_size, dtype=self.dtype, device=self.device)

    def _span_forward(self, ids: torch.Tensor, rows: torch.Tensor, num_kv: torch.Tensor) -> tuple:
        span = ids.shape[1]
        positions, meta = self._span_meta(rows, num_kv, span, causal=True)
        features = self._features(ids.numel())
        hidden = self.target.forward(ids.reshape(-1), positions, meta, self.kv, self.taps, features)
        logits = self.target.logits(hidden)
        return logits, self.ops.argmax(logits), features

    def extend(self, reqs: list[Request], ids: torch.Tensor) -> SpanResult:
        """Rows ids[i] = [current, d1..dk] of each request at positions num_kv .. num_kv + S - 1:
        a plain decode (S = 1) or a verify span, causal within the span."""
        return self.extend_rows(ids, [r.slot for r in reqs], [r.num_kv for r in reqs])

    def extend_rows(self, ids: torch.Tensor, table_rows: Sequence[int], num_kv: Sequence[int]) -> SpanResult:
        """Span groups ids[i] on block-table row table_rows[i] at positions num_kv[i] .. + S - 1."""
        n, span = ids.shape
        values = {
            "ids": ids,
            "rows": self._tensor(list(table_rows)),
            "num_kv": self._tensor(list(num_kv)),
        }
        pads = {"ids": 0, "rows": self.null_row, "num_kv": 0}
        logits, greedy, features = self._run(("span", span), self._span_forward, n, values, pads)
        rows = n * span
        return SpanResult(logits[:rows], greedy[:rows], None if features is None else features[:rows])

    # -- drafter -----------------------------------------------------------------------------------
    def draft(self, reqs: list[Request]) -> torch.Tensor:
        """One batched drafter forward: store every request's pending context rows, then run all
        blocks [current, mask x (B-1)] non-causally. Returns drafts [N, drafts_per_round] (device)."""
        return self._draft(reqs, ())[0]

    def draft_chains(self, reqs: list[Request], positions: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """`draft` with a Markov head, plus every request's hedge chain at each branch position:
        (drafts [N, D], chains [N, P, D]) on the device."""
        if self.drafter.markov is None or not positions:
            raise ValueError("hedge chains need a Markov-head drafter and at least one branch position")
        drafts, chains = self._draft(reqs, positions)
        return drafts, chains

    def _draft(self, reqs: list[Request], branch: tuple[int, ...]) -> tuple:
        """Pending context rows ride in the draft step, packed to `ctx_rows` per request so the
        step keeps a static shape (unused rows write zeros to the null block); a request with more
        pending rows (its prompt, or several gated rounds) is stored eagerly first."""
        n, width = len(reqs), self.ctx_rows
        spill_feats, spill_pos, spill_slots = [], [], []
        packed, dest = [], []
        ctx_pos, ctx_slots = [0] * (n * width), [0] * (n * width)
        for i, r in enumerate(reqs):
            pending = sum(t.shape[0] for t in r.ctx_pending)
            if r.draft_kv_len + pending != r.num_kv:
                raise RuntimeError(f"{r.id}: drafter context {r.draft_kv_len}+{pending} rows != {r.num_kv} committed")
            span = range(r.draft_kv_len, r.num_kv)
            if pending <= width:
                packed += r.ctx_pending
                dest += range(i * width, i * width + pending)
                ctx_pos[i * width : i * width + pending] = span
                ctx_slots[i * width : i * width + pending] = self._slots(r, span)
            else:
                spill_feats += r.ctx_pending
                spill_pos += span
                spill_slots += self._slots(r, span)
            r.ctx_pending = []
            r.draft_kv_len = r.num_kv
        if spill_feats:
            self.drafter.store_context(
                torch.cat(spill_feats), self._tensor(spill_pos), self._tensor(spill_slots), self.draft_kv
            )
        ctx = torch.zeros(n, width, self.drafter.cfg.feature_size, dtype=self.dtype, device=self.device)
        if packed:
            ctx.view(n * width, -1).index_copy_(0, self._tensor(dest), torch.cat(packed))
        values = {
            "anchors": self._tensor([r.current_token for r in reqs]),
            "rows": self._tensor([r.slot for r in reqs]),
            "num_kv": self._tensor([r.num_kv for r in reqs]),
            "ctx": ctx,
            "ctx_pos": self._tensor(ctx_pos).view(n, width),
            "ctx_slots": self._tensor(ctx_slots).view(n, width),
        }
        pads = {"anchors": 0, "rows": self.null_row, "num_kv": 0, "ctx": 0, "ctx_pos": 0, "ctx_slots": 0}
        fn = partial(self._block_forward, branch=branch)
        out = self._run(("draft", branch), fn, n, values, pads)
        return tuple(t[:n] for t in out)

    def _block_forward(
        self,
        anchors: torch.Tensor,
        rows: torch.Tensor,
        num_kv: torch.Tensor,
        ctx: torch.Tensor,
        ctx_pos: torch.Tensor,
        ctx_slots: torch.Tensor,
        branch: tuple[int, ...] = (),
    ) -> tuple:
        """Store the packed context rows, then drafts [N, D] (argmax per row, or the Markov walk),
        plus chains [N, P, D] with branch positions. Static shapes and no host reads: captured whole."""
        cfg = self.drafter.cfg
        self.drafter.store_context(ctx.flatten(0, 1), ctx_pos.reshape(-1), ctx_slots.reshape(-1), self.draft_kv)
        n, b = anchors.shape[0], cfg.block_size
        ids = torch.full((n, b), cfg.mask_token_id, dtype=torch.int64, device=self.device)
        ids[:, 0] = anchors
        positions, meta = self._span_meta(rows, num_kv, b, causal=False)
        hidden = self.drafter.forward_block(ids.reshape(-1), positions, meta, self.draft_kv)
        first = 0 if cfg.anchor_first else 1
        d = b - first
        logits = self.target.logits(hidden.view(n, b, -1)[:, first:].reshape(n * d, -1))
        if self.drafter.markov is None:
            return (self.ops.argmax(logits).view(n, d),)
        w1, w2 = self.drafter.markov
        drafts, chains = markov_walk(logits.view(n, d, -1), anchors, w1, w2, branch, self.ops.linear, self.ops.argmax)
        return (drafts,) if chains is None else (drafts, chains)
