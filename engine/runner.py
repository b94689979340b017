"""Executing a step on the device: prefill, uniform spans (decode / verify), drafter forwards, CUDA graphs.

A span step with N row groups and S rows each is replayed from a CUDA graph captured for exactly
(bucket(N), S): inputs are padded to the bucket with rows that point at the null block. Any other
shape runs eagerly; a graph is never replayed for a shape it was not captured at. Hedge chains are
extra row groups of the same span with block-table rows of their own (after the null row), so a
hedged verify is one more span step of the same shape family; the draft graph is keyed on the
branch positions it walks.

A decode, gated or speculative step reads its per-request inputs (current token, table row,
committed rows, draft limit) from one staged buffer, copied host -> device once per step; the
verify graph takes the draft graph's output buffer as is and accepts on the device, so a round
costs one copy in, two graph launches and one copy out. Every target forward that captures
features also stores them as drafter context K/V at the same slots: rows a round rejects sit past
the committed length, where the drafter never looks and later rows overwrite them.
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

STAGED = ("token", "row", "num_kv", "limit")  # the staged per-request step inputs, in buffer order


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
            static = self.inputs[name]
            if value.data_ptr() != static.data_ptr():  # a buffer captured as is needs no copy
                static.copy_(value, non_blocking=True)
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
        # The staged step inputs, one field per row: current token, table row, committed rows, limit.
        width = max(self.buckets)
        pinned = self.device.type == "cuda"
        self.staged = torch.zeros(len(STAGED), width, dtype=torch.int64, device=self.device)
        self._staged_host = torch.zeros(len(STAGED), width, dtype=torch.int64, pin_memory=pinned)
        self._staged_copied = torch.cuda.Event() if pinned else None
        self._staged_for: list[Request] | None = None
        self._last_drafts: torch.Tensor | None = None

    # -- host -> device -----------------------------------------------------------------------------
    def _tensor(self, values: list[int], dtype: torch.dtype = torch.int64) -> torch.Tensor:
        if self.device.type == "cuda":
            return torch.tensor(values, dtype=dtype, pin_memory=True).to(self.device, non_blocking=True)
        return torch.tensor(values, dtype=dtype, device=self.device)

    def stage(self, reqs: list[Request], limits: Sequence[int] | None = None) -> None:
        """Copy the step's per-request inputs to the device in one transfer, padded to the graph
        bucket with null-block rows; `decode`, `draft` and `verify` of these requests read them."""
        n = len(reqs)
        pad = self._rows(n) - n
        fields = [
            [r.current_token for r in reqs] + [0] * pad,
            [r.slot for r in reqs] + [self.null_row] * pad,
            [r.num_kv for r in reqs] + [0] * pad,
            (list(limits) if limits is not None else [0] * n) + [0] * pad,
        ]
        if self._staged_copied is not None:
            self._staged_copied.synchronize()  # the pinned buffer's previous copy has left
        self._staged_host[:, : n + pad] = torch.tensor(fields, dtype=torch.int64)
        self.staged.copy_(self._staged_host, non_blocking=True)
        if self._staged_copied is not None:
            self._staged_copied.record()
        self._staged_for = reqs

    def _check_staged(self, reqs: list[Request]) -> None:
        if self._staged_for is not reqs and self._staged_for != reqs:
            raise RuntimeError("stage(reqs) must run before a decode, draft or verify of the same requests")

    def field(self, name: str, m: int) -> torch.Tensor:
        return self.staged[STAGED.index(name), :m]

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

    def _rows(self, n: int) -> int:
        """Rows a step of n requests runs at: its graph bucket, or n when eager."""
        return self._bucket(n) or n

    def _bucket(self, n: int) -> int | None:
        if not self.use_graphs:
            return None
        return next((b for b in self.buckets if b >= n), None)

    def _run(
        self,
        key: tuple,
        fn: Callable[..., tuple],
        n: int,
        values: dict[str, torch.Tensor],
        pads: dict,
        shared: frozenset[str] = frozenset(),
    ) -> tuple:
        """Eager, or the graph captured for exactly this (kind, bucket, shape). `shared` inputs
        arrive as persistent bucket-sized buffers: captured as they are, never padded or copied."""
        bucket = self._bucket(n)
        if bucket is None:
            return fn(**values)
        values = {
            k: v
            if k in shared or v.shape[0] == bucket
            else torch.cat(
                [v, torch.full((bucket - v.shape[0], *v.shape[1:]), pads[k], dtype=v.dtype, device=v.device)]
            )
            for k, v in values.items()
        }
        key = (*key, bucket)
        graph = self.graphs.get(key)
        if graph is None:
            log.debug("capturing CUDA graph %s", key)
            inputs = {k: v if k in shared else v.clone() for k, v in values.items()}
            graph = self.graphs[key] = _Graph(fn, inputs, self._pool)
        return graph.replay(**values)

    # -- target ------------------------------------------------------------------------------------
    def prefill(self, reqs: list[Request]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Whole prompts, eagerly. Returns logits and argmax at each prompt's last row, and feature
        rows for every prompt row when a drafter is loaded (also stored as its context)."""
        ids, positions, slots, starts = [], [], [], [0]
        for r in reqs:
            n = len(r.prompt_ids)
            ids += r.prompt_ids
            positions += range(n)
            slots += self._slots(r, range(n))
            starts.append(starts[-1] + n)
        rows = self._tensor([r.slot for r in reqs])
        slot_mapping, position_ids = self._tensor(slots), self._tensor(positions)
        meta = AttnMeta(
            slot_mapping,
            self.block_tables.index_select(0, rows),
            self._tensor([len(r.prompt_ids) for r in reqs], torch.int32),
            self._tensor(starts, torch.int32),
            max(len(r.prompt_ids) for r in reqs),
            causal=True,
        )
        features = self._features(len(ids))
        hidden = self.target.forward(self._tensor(ids), position_ids, meta, self.kv, self.taps, features)
        if features is not None:
            self.drafter.store_context(features, position_ids, slot_mapping, self.draft_kv)
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
        if features is not None:
            self.drafter.store_context(features, positions, meta.slot_mapping, self.draft_kv)
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
        return _trim(SpanResult(logits, greedy, features), n * span)

    def decode(self, reqs: list[Request]) -> SpanResult:
        """Each staged request's current token at position num_kv (a plain or gated step)."""
        self._check_staged(reqs)
        n = len(reqs)
        logits, greedy, features = self._run(("decode",), partial(self._staged_decode, self._rows(n)), n, {}, {})
        return _trim(SpanResult(logits, greedy, features), n)

    def _staged_decode(self, m: int) -> tuple:
        ids = self.field("token", m)[:, None]
        return self._span_forward(ids, self.field("row", m), self.field("num_kv", m))

    def verify(self, reqs: list[Request], drafts: torch.Tensor, k: int) -> tuple[SpanResult, torch.Tensor]:
        """The staged requests' spans [current, d1..dk] in one target forward, accepted on the device
        against the greedy targets under the staged limits. Returns the span result and, per request,
        [accepted n, d1..dk, target after each of the k + 1 span rows] (int64 [N, 2k + 2])."""
        self._check_staged(reqs)
        n = len(reqs)
        # The draft graph's own output buffer is taken as is (no pad, no copy); other drafts are copied in.
        shared = self._last_drafts is not None and drafts.data_ptr() == self._last_drafts.data_ptr()
        values = {"drafts": (self._last_drafts if shared else drafts)[:, :k]}
        fn = partial(self._staged_verify, m=self._rows(n), k=k)
        out = self._run(("verify", k), fn, n, values, {"drafts": 0}, frozenset({"drafts"} if shared else ()))
        logits, greedy, features, rounds = out
        return _trim(SpanResult(logits, greedy, features), n * (1 + k)), rounds[:n]

    def _staged_verify(self, drafts: torch.Tensor, m: int, k: int) -> tuple:
        ids = torch.cat([self.field("token", m)[:, None], drafts], dim=1)
        logits, greedy, features = self._span_forward(ids, self.field("row", m), self.field("num_kv", m))
        targets = greedy.view(m, k + 1)
        accepted = self.ops.accept_prefix(drafts, targets, self.field("limit", m))
        return logits, greedy, features, torch.cat([accepted[:, None], drafts, targets], dim=1)

    # -- drafter -----------------------------------------------------------------------------------
    def draft(self, reqs: list[Request]) -> torch.Tensor:
        """One batched drafter forward over the staged requests: blocks [current, mask x (B-1)] run
        non-causally over each drafter context. Returns drafts [N, drafts_per_round] (device)."""
        return self._draft(reqs, ())[0]

    def draft_chains(self, reqs: list[Request], positions: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """`draft` with a Markov head, plus every request's hedge chain at each branch position:
        (drafts [N, D], chains [N, P, D]) on the device."""
        if self.drafter.markov is None or not positions:
            raise ValueError("hedge chains need a Markov-head drafter and at least one branch position")
        drafts, chains = self._draft(reqs, positions)
        return drafts, chains

    def _draft(self, reqs: list[Request], branch: tuple[int, ...]) -> tuple:
        """Context rows still pending (a hedge chain's winning rows) are stored first, eagerly."""
        self._check_staged(reqs)
        feats, pos, slots = [], [], []
        for r in reqs:
            pending = sum(t.shape[0] for t in r.ctx_pending)
            if r.draft_kv_len + pending != r.num_kv:
                raise RuntimeError(f"{r.id}: drafter context {r.draft_kv_len}+{pending} rows != {r.num_kv} committed")
            if pending:
                span = range(r.draft_kv_len, r.num_kv)
                feats += r.ctx_pending
                pos += span
                slots += self._slots(r, span)
                r.ctx_pending = []
                r.draft_kv_len = r.num_kv
        if feats:
            self.drafter.store_context(torch.cat(feats), self._tensor(pos), self._tensor(slots), self.draft_kv)
        n = len(reqs)
        out = self._run(("draft", branch), partial(self._block_forward, self._rows(n), branch), n, {}, {})
        self._last_drafts = out[0]
        return tuple(t[:n] for t in out)

    def _block_forward(self, m: int, branch: tuple[int, ...] = ()) -> tuple:
        """Drafts [m, D] (argmax per row, or the Markov walk), plus chains [m, P, D] with branch
        positions. Static shapes and no host reads: captured whole."""
        cfg = self.drafter.cfg
        b = cfg.block_size
        anchors = self.field("token", m)
        ids = torch.full((m, b), cfg.mask_token_id, dtype=torch.int64, device=self.device)
        ids[:, 0] = anchors
        positions, meta = self._span_meta(self.field("row", m), self.field("num_kv", m), b, causal=False)
        hidden = self.drafter.forward_block(ids.reshape(-1), positions, meta, self.draft_kv)
        first = 0 if cfg.anchor_first else 1
        d = b - first
        logits = self.target.logits(hidden.view(m, b, -1)[:, first:].reshape(m * d, -1))
        if self.drafter.markov is None:
            return (self.ops.argmax(logits).view(m, d),)
        w1, w2 = self.drafter.markov
        drafts, chains = markov_walk(logits.view(m, d, -1), anchors, w1, w2, branch, self.ops.linear, self.ops.argmax)
        return (drafts,) if chains is None else (drafts, chains)


def _trim(res: SpanResult, rows: int) -> SpanResult:
    """The real rows of a (possibly bucket-padded) span result."""
    return SpanResult(res.logits[:rows], res.greedy[:rows], None if res.features is None else res.features[:rows])
