"""Executing a step on the device: prefill, uniform spans (decode / verify), drafter forwards, CUDA graphs
(engine/graphs.py; padded to the batch bucket with null-block rows). A decode, draft or verify reads the
inputs `stage` copied (engine/staging.py); every target forward that captures features stores them as
drafter context K/V at the same slots (docs/architecture.md, "Walk of one step")."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import torch

from engine.graphs import StepGraphs, batch_buckets
from engine.kernels.attention import SPLIT_KEYS
from engine.kv_cache import allocate_kv_cache
from engine.models.dflash import DFlashDrafter
from engine.models.layers import AttnMeta, last_keys
from engine.models.markov import markov_walk
from engine.models.qwen3 import Qwen3ForCausalLM
from engine.prefill import prefill as run_prefill
from engine.prefill import staged_buffers
from engine.request import Request
from engine.staging import StagedInputs

SHORT_KEYS = 2 * SPLIT_KEYS  # a decode whose sequences all fit runs on a table this wide: no extra splits
# The accept rule (engine/round.py): (drafts [M, k], targets [M, k + 1], limits [M]) -> rows [M, 2k + 2].
AcceptRule = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class SpanResult:
    """With graphs on, logits and features are views of one runner buffer each: valid until the next step."""

    logits: torch.Tensor  # [N * S, V]
    greedy: torch.Tensor  # [N * S] int64
    features: torch.Tensor | None  # [N * S, n_taps * H]


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
        shared_kv: list | None = None,  # another runner's target KV (Engine(kv_from=))
        draft_window: int = 0,  # the drafter's context rows attended (whole blocks from the last ones); 0: all
    ):
        self.target, self.drafter, self.draft_window = target, drafter, draft_window
        self.device, self.dtype, self.ops, self.block_size = target.device, target.dtype, target.ops, block_size

        def pool(g) -> list:  # the KV pool of a model of geometry g
            dims = g.num_layers, num_blocks, block_size, g.num_kv_heads, g.head_dim
            return allocate_kv_cache(*dims, self.dtype, self.device)

        self.kv = shared_kv or pool(target.g)
        self.draft_kv, self.taps = [], ()  # taps: the target layers whose features the drafter reads
        if drafter is not None:
            self.draft_kv, self.taps = pool(drafter.g), drafter.cfg.target_layer_ids
        # One row per request slot, a null row (all block 0) for padded rows, then one per hedge chain.
        self.block_tables = torch.zeros(
            max_num_seqs + 1 + chain_rows, max_blocks_per_seq, dtype=torch.int32, device=self.device
        )
        self.null_row = max_num_seqs
        self.decode_widths = sorted({min(-(-SHORT_KEYS // block_size), max_blocks_per_seq), max_blocks_per_seq})
        self.chain_row0 = max_num_seqs + 1
        self.graphs = StepGraphs(use_graphs, sorted(set(batch_buckets(max_num_seqs + chain_rows)) | {max_num_seqs}))
        width = max(self.graphs.buckets)
        self.inputs = StagedInputs(width, self.device, self.null_row)
        self._last_drafts: torch.Tensor | None = None
        rows = width * (1 + (drafter.cfg.block_size if drafter is not None else 0)) if self.graphs.enabled else 0
        logits = torch.empty(rows, target.lm_head.shape[0], dtype=self.dtype, device=self.device)
        self._span_out = (logits, self.features(rows)) if rows else None
        self.prefill_staged = staged_buffers(width, self.device) if self.graphs.enabled else None

    # -- host -> device -----------------------------------------------------------------------------
    def to_device(self, values: Sequence[int], dtype: torch.dtype = torch.int64) -> torch.Tensor:
        if self.device.type == "cuda":
            return torch.tensor(list(values), dtype=dtype, pin_memory=True).to(self.device, non_blocking=True)
        return torch.tensor(list(values), dtype=dtype, device=self.device)

    def stage(
        self, reqs: list[Request], limits: Sequence[int] | None = None, next_tokens: torch.Tensor | None = None
    ) -> None:
        """Copy the step's per-request inputs to the device in one transfer, padded to the graph
        bucket with null-block rows; `decode`, `draft` and `verify` of these requests read them.
        next_tokens: stage the decode step after the one already launched instead, its tokens these
        (that step's greedy tokens, on the device) at one row past each request's committed rows."""
        n = len(reqs)
        pad = self.graphs.rows(n) - n
        ahead = int(next_tokens is not None)
        kv = [r.num_kv + ahead for r in reqs]  # a decode's keys: one more each; its table the narrowest holding them
        self._staged_width = next((w for w in self.decode_widths if w * self.block_size > max(kv, default=0)), None)
        fields = [
            [0 if ahead else r.current_token for r in reqs] + [0] * pad,
            [r.slot for r in reqs] + [self.null_row] * pad,
            kv + [0] * pad,
            (list(limits) if limits is not None else [0] * n) + [0] * pad,
            [r.remaining for r in reqs] + [0] * pad,
        ]
        self.inputs.copy(reqs, fields)
        if next_tokens is not None:  # in stream order: after the launched step wrote them, before the next reads
            self.field("token", n).copy_(next_tokens)

    def stage_round(self, reqs: list[Request], rows: torch.Tensor, k: int, index: list[int]) -> None:
        """The speculative round after the staged one, for reqs[i] = its request index[i], staged on the
        device from its accept rows (StagedInputs.advance_round)."""
        same = index == list(range(rows.shape[0]))
        self.inputs.advance_round(reqs, rows, k, None if same else self.to_device(index))

    def reset(self) -> None:
        """Forget the staged step and the last drafts after a failed step (the next step restages)."""
        self.inputs.reqs = self._last_drafts = None

    def field(self, name: str, m: int) -> torch.Tensor:
        return self.inputs.field(name, m)

    def assign_blocks(self, reqs: Sequence[Request]) -> None:
        """The requests' block-table rows, one copy from pinned memory: no wait for a step launched ahead."""
        pinned = self.device.type == "cuda"
        rows = torch.zeros(len(reqs), self.block_tables.shape[1], dtype=torch.int32, pin_memory=pinned)
        for i, r in enumerate(reqs):
            rows[i, : len(r.blocks)] = torch.tensor(r.blocks, dtype=torch.int32)
        self.block_tables.index_copy_(
            0, self.to_device([r.slot for r in reqs]), rows.to(self.device, non_blocking=pinned)
        )

    def set_table_rows(self, first: int, tables: torch.Tensor) -> None:
        """Block-table rows first.. (the hedge chains' rows) from host tables."""
        self.block_tables[first : first + tables.shape[0]].copy_(tables)

    def slots(self, req: Request, positions: range) -> list[int]:
        """KV slots (block * block_size + offset) of a request's positions."""
        bs = self.block_size
        return [req.blocks[p // bs] * bs + p % bs for p in positions]

    # -- device-side index math (graph-safe) --------------------------------------------------------
    def _span_meta(self, rows: torch.Tensor, num_kv: torch.Tensor, span: int, causal: bool, width: int | None = None):
        positions, slots, tables, seq_lens, qsl = self.ops.span_meta(
            self.block_tables[:, :width], rows, num_kv, span, self.block_size
        )
        return positions, AttnMeta(slots, tables, seq_lens, qsl, span, causal)

    # -- target ------------------------------------------------------------------------------------
    def prefill(self, reqs: list[Request]) -> tuple[torch.Tensor, torch.Tensor]:
        """Whole prompts (`prefill_ids`: prompt + committed output after a preemption): logits and argmax
        at each prompt's last row; with a drafter every row's features are stored as its context."""
        return run_prefill(self, reqs)

    def features(self, rows: int) -> torch.Tensor | None:
        if not self.taps:
            return None
        return torch.empty(rows, self.drafter.cfg.feature_size, dtype=self.dtype, device=self.device)

    def logits_buffer(self, rows: int) -> torch.Tensor:
        """The first `rows` rows of the shared logits buffer (graphs on)."""
        return self._span_out[0][:rows]

    def _span_outputs(self, rows: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """A span step's logits and features: views of one shared buffer each, or (None, fresh) eager."""
        if self._span_out is None or rows > self._span_out[0].shape[0]:
            return None, self.features(rows)
        logits, features = self._span_out
        return logits[:rows], None if features is None else features[:rows]

    def _span_forward(self, ids: torch.Tensor, rows: torch.Tensor, num_kv: torch.Tensor, width: int | None = None):
        return self.flat_forward(ids.reshape(-1), *self._span_meta(rows, num_kv, ids.shape[1], True, width))

    def flat_forward(self, ids: torch.Tensor, positions: torch.Tensor, meta: AttnMeta) -> tuple:
        """Flat rows through the target, their features stored as drafter context: (logits, greedy, features)."""
        out, features = self._span_outputs(ids.numel())
        hidden = self.target.forward(ids, positions, meta, self.kv, self.taps, features)
        if features is not None:
            self.drafter.store_context(features, positions, meta.slot_mapping, self.draft_kv)
        logits = self.target.logits(hidden, out=out)
        return logits, self.ops.argmax(logits), features

    def span_rows(self, ids: torch.Tensor, table_rows: Sequence[int], num_kv: Sequence[int]) -> SpanResult:
        """Span groups ids[i] on block-table row table_rows[i] at positions num_kv[i] .. + S - 1."""
        n, span = ids.shape
        values = {"ids": ids, "rows": self.to_device(list(table_rows)), "num_kv": self.to_device(list(num_kv))}
        pads = {"ids": 0, "rows": self.null_row, "num_kv": 0}
        return _rows(self.graphs.run(("span", span), self._span_forward, n, values, pads), n * span)

    def decode(self, reqs: list[Request], width: int | None = None) -> SpanResult:
        """Each staged request's current token at position num_kv (a plain or gated step) on `width` table
        columns: SHORT_KEYS' worth where the staged keys fit, else all (decode_widths; the split grid follows)."""
        self.inputs.check(reqs)
        n, width = len(reqs), width or self._staged_width or self.decode_widths[-1]
        fn = partial(self._staged_decode, self.graphs.rows(n), width)
        return _rows(self.graphs.run(("decode", width), fn, n, {}, {}), n)

    def _staged_decode(self, m: int, width: int) -> tuple:
        ids = self.field("token", m)[:, None]
        return self._span_forward(ids, self.field("row", m), self.field("num_kv", m), width)

    def verify(
        self, reqs: list[Request], drafts: torch.Tensor, k: int, accept: AcceptRule
    ) -> tuple[SpanResult, torch.Tensor]:
        """The staged requests' spans [current, d1..dk] in one target forward, then `accept` on the
        device against the greedy targets under the staged limits. Returns the span result and the
        accept rule's rows per request (int64 [N, 2k + 2])."""
        self.inputs.check(reqs)
        n = len(reqs)
        # The draft graph's own output buffer is taken as is (no pad, no copy); other drafts are copied in.
        shared = self._last_drafts is not None and drafts.data_ptr() == self._last_drafts.data_ptr()
        values = {"drafts": (self._last_drafts if shared else drafts)[:, :k]}
        fn = partial(self._staged_verify, m=self.graphs.rows(n), k=k, accept=accept)
        key = ("verify", k, accept)
        out = self.graphs.run(key, fn, n, values, {"drafts": 0}, frozenset({"drafts"} if shared else ()))
        return _rows(out, n * (1 + k)), out[3][:n]

    def _staged_verify(self, drafts: torch.Tensor, m: int, k: int, accept: AcceptRule) -> tuple:
        ids = torch.cat([self.field("token", m)[:, None], drafts], dim=1)
        logits, greedy, features = self._span_forward(ids, self.field("row", m), self.field("num_kv", m))
        return logits, greedy, features, accept(drafts, greedy.view(m, k + 1), self.field("limit", m))

    # -- drafter -----------------------------------------------------------------------------------
    def store_context(self, features: torch.Tensor, positions: Sequence[int], slots: Sequence[int]) -> None:
        """Feature rows as drafter context K/V at these positions and KV slots (eagerly)."""
        self.drafter.store_context(features, self.to_device(positions), self.to_device(slots), self.draft_kv)

    def draft(self, reqs: list[Request], heads: int | None = None) -> torch.Tensor:
        """One batched drafter forward over the staged requests: blocks [current, mask x (B-1)] run
        non-causally over each drafter context, the LM head (and the Markov walk) over the first `heads`
        draft positions only (the K the round verifies; None: all). Returns drafts [N, heads] (device),
        bit-identical to the first `heads` of the full head's where the LM head is row-invariant."""
        per_round = self.drafter.cfg.drafts_per_round
        heads = per_round if heads is None else heads
        if not 1 <= heads <= per_round:
            raise ValueError(f"draft heads {heads} outside [1, {per_round}]")
        if self.drafter.markov is not None and self.graphs.enabled:
            # graphed in bf16 its walk over K positions differed from the full walk's first K (H200)
            return self._draft(reqs, (), per_round)[0][:, :heads]
        return self._draft(reqs, (), heads)[0]

    def draft_chains(self, reqs: list[Request], positions: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """`draft` with a Markov head, plus every request's hedge chain at each branch position:
        (drafts [N, D], chains [N, P, D]) on the device."""
        if self.drafter.markov is None or not positions:
            raise ValueError("hedge chains need a Markov-head drafter and at least one branch position")
        return self._draft(reqs, positions, self.drafter.cfg.drafts_per_round)

    def _draft(self, reqs: list[Request], branch: tuple[int, ...], heads: int) -> tuple:
        self.inputs.check(reqs)
        for r in reqs:
            if r.draft_kv_len != r.num_kv:
                raise RuntimeError(f"{r.id}: drafter context {r.draft_kv_len} rows != {r.num_kv} committed")
        n = len(reqs)
        fn = partial(self._block_forward, self.graphs.rows(n), branch, heads)
        out = self.graphs.run(("draft", branch, heads), fn, n, {}, {})
        self._last_drafts = out[0]
        return tuple(t[:n] for t in out)

    def _block_forward(self, m: int, branch: tuple[int, ...], heads: int) -> tuple:
        """Drafts [m, heads] (argmax per row, or the Markov walk: causal, so its first `heads` steps need
        only those rows' logits), plus chains [m, P, D] with branch positions (heads = D). Static shapes
        and no host reads: captured whole."""
        cfg, b, d = self.drafter.cfg, self.drafter.cfg.block_size, heads
        anchors = self.field("token", m)
        ids = torch.full((m, b), cfg.mask_token_id, dtype=torch.int64, device=self.device)
        ids[:, 0] = anchors
        positions, meta = self._span_meta(self.field("row", m), self.field("num_kv", m), b, causal=False)
        if self.draft_window:
            meta = last_keys(meta, self.draft_window + b, self.block_size)
        hidden = self.drafter.forward_block(ids.reshape(-1), positions, meta, self.draft_kv)
        first = 0 if cfg.anchor_first else 1
        logits = self.target.logits(hidden.view(m, b, -1)[:, first : first + d].reshape(m * d, -1))
        if self.drafter.markov is None:
            return (self.ops.argmax(logits).view(m, d),)
        w1, w2 = self.drafter.markov
        drafts, chains = markov_walk(logits.view(m, d, -1), anchors, w1, w2, branch, self.ops.linear, self.ops.argmax)
        return (drafts,) if chains is None else (drafts, chains)


def _rows(out: tuple, rows: int) -> SpanResult:
    """The real rows of a (possibly bucket-padded) step's (logits, greedy, features, ...)."""
    logits, greedy, features = out[:3]
    return SpanResult(logits[:rows], greedy[:rows], None if features is None else features[:rows])
