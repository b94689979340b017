"""Forwards on an idle engine before it serves: dummy requests outside the engine's request table (slots
and KV handed back on exit), and `warm_graphs`, which captures every graph a round can replay."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

import torch

from engine.config import EngineConfig, SamplingParams
from engine.kernels.span_meta import ragged_spans
from engine.kv_cache import BlockManager
from engine.levers import Levers
from engine.models.config import DFlashConfig, Qwen3Config
from engine.policy.span import policy_spans
from engine.prefill import prefill_shapes, warm_prefill
from engine.ragged import ragged_verify
from engine.request import Finish, Request
from engine.runner import AcceptRule, ModelRunner
from engine.scheduler import Plan, Scheduler

log = logging.getLogger(__name__)

CONTEXT = 64  # tokens in each dummy request's cache: a short decode context
LONG_CONTEXT = 2048  # the second context calibrated: the table's context axis (KV read per token)
LONG_BATCHES = (1, 8)  # batches timed there (graphs; eager engines time batch 1 only)


class EngineView(Protocol):
    """The parts of engine.Engine these forwards read (engine.py imports this module)."""

    config: EngineConfig
    levers: Levers
    device: torch.device
    dtype: torch.dtype
    target_cfg: Qwen3Config
    draft_cfg: DFlashConfig | None
    drafter: object | None
    runner: ModelRunner
    scheduler: Scheduler
    blocks: BlockManager
    max_model_len: int

    @property
    def drafts_per_round(self) -> int: ...


@dataclasses.dataclass(frozen=True)
class CalibrationPlan:
    """What a calibration measures: dummy requests of `context` tokens, verify spans, batches; then
    `long_batches` at `long_context` tokens (none where max_model_len or the pool has no room)."""

    context: int
    spans: list[int]
    batches: list[int]
    long_context: int = 0
    long_batches: list[int] = dataclasses.field(default_factory=list)


def plan_calibration(engine: EngineView, context: int = CONTEXT) -> CalibrationPlan:
    """The policy's spans; powers of two up to max_num_seqs and max_num_seqs itself, as many as the free
    KV pool holds; the contexts shortened to what max_model_len admits."""
    _require_idle(engine)
    spans = policy_spans(engine.drafts_per_round)
    room = engine.max_model_len - engine.scheduler.headroom - max(spans) - 1  # the budget is max span + 1
    context = min(context, room)
    if context < 1:
        raise RuntimeError(f"calibration: max_model_len {engine.max_model_len} leaves no room for a span")
    per_request = engine.scheduler.blocks_needed(_dummy(0, context, max(spans), 1))
    most = min(engine.config.max_num_seqs, engine.blocks.num_free // per_request)
    if most < 1:
        raise RuntimeError(f"calibration: the KV pool has no room for one request of {context} tokens")
    batches = sorted({1 << i for i in range(most.bit_length())} | {most})
    long = min(LONG_CONTEXT, room)
    fits = engine.blocks.num_free // engine.scheduler.blocks_needed(_dummy(0, long, max(spans), 1))
    wanted = LONG_BATCHES if engine.runner.graphs.enabled else LONG_BATCHES[:1]
    long_batches = [b for b in wanted if b <= min(fits, engine.config.max_num_seqs)] if long > 2 * context else []
    return CalibrationPlan(context, spans, batches, long if long_batches else 0, long_batches)


def _require_idle(engine: EngineView) -> None:  # a busy scheduler could plan a step of live requests
    if engine.scheduler.has_work():
        raise RuntimeError(f"calibration needs an idle engine: {engine.scheduler.describe()}")


def _dummy(i: int, context: int, budget: int, vocab: int) -> Request:
    ids = [(7 * i + 3 * t + 1) % vocab for t in range(context)]  # any in-vocabulary ids: only costs are read
    return Request(-1 - i, ids, SamplingParams(temperature=0, max_tokens=budget + 1, ignore_eos=True), frozenset())


@contextlib.contextmanager
def dummy_requests(engine: EngineView, count: int, context: int, budget: int) -> Iterator[list[Request]]:
    """`count` prefilled, draft-ready requests of `context` tokens with KV reserved for `budget` more
    rows, outside the engine's request table; their slots and blocks are handed back on exit."""
    _require_idle(engine)
    scheduler, runner = engine.scheduler, engine.runner
    vocab = engine.target_cfg.geometry.vocab_size
    reqs = [_dummy(i, context, budget, vocab) for i in range(count)]
    reserve, scheduler.reserve_budget = scheduler.reserve_budget, True
    try:
        for r in reqs:
            scheduler.add(r)
        while scheduler.waiting:
            step = scheduler.schedule()
            if step is None or step.plan is not Plan.PREFILL:
                raise RuntimeError(f"calibration: the dummy requests do not fit ({scheduler.describe()})")
            runner.assign_blocks(step.grown)
            _, greedy = runner.prefill(step.reqs)
            for r, token in zip(step.reqs, greedy.tolist(), strict=True):
                r.prefilled(token, context_stored=engine.drafter is not None)
        yield reqs
    finally:
        scheduler.reserve_budget = reserve
        for r in reqs:
            r.finish(Finish.ABORT)
            scheduler.release(r)
        runner.reset()


def warm_graphs(
    runner: ModelRunner,
    accept: AcceptRule,
    reqs: Sequence[Request],
    batches: Sequence[int],
    ks: Sequence[int],
    one_token: bool = True,
    stop: Callable[[int], bool] | None = None,
    ragged: Sequence[int] = (),
) -> int:
    """At each batch (the first `batch` of `reqs`; stop(batch): end before it) the one-token step; per K the
    drafter and the verify of K drafts on its buffer; per S in `ragged` one of batch * S - 1 rows."""
    before, frozen = runner.graphs.captures, runner.graphs.frozen
    runner.graphs.frozen = False  # a warm-up captures even on a serving engine
    try:
        for b in sorted(batches):
            if stop is not None and stop(b):
                break
            sub = list(reqs[:b])
            if one_token:  # at each table width that holds their keys (a narrower one would read past it)
                runner.stage(sub)
                for width in (w for w in runner.decode_widths if w * runner.block_size > max(r.num_kv for r in sub)):
                    runner.decode(sub, width)
            shapes = [[k] * b for k in ks] + [[s - 1] * (b - 1) + [s - 2] for s in ragged if b > 1]
            for spans in shapes:  # the verify takes the draft graph's own buffer, as rounds do
                runner.stage(sub)
                drafts = runner.draft(sub, spans[0])
                runner.stage(sub, spans)
                if len(set(spans)) == 1:
                    runner.verify(sub, drafts, spans[0], accept)
                else:
                    ragged_verify(runner, sub, drafts, spans, accept)
    finally:
        runner.graphs.frozen = frozen
    return runner.graphs.captures - before


def _capture(engine: EngineView, accept: AcceptRule, ks: Sequence[int] | None, ragged: Sequence[int] = ()) -> list[int]:
    """warm_graphs at every bucket the KV pool admits, on dummy requests, per K in ks (None: the policy's
    spans); the buckets."""
    how = plan_calibration(engine)
    ks = [s - 1 for s in how.spans if s > 1] if ks is None else ks
    buckets = [b for b in engine.runner.graphs.buckets if b <= max(how.batches)]
    with dummy_requests(engine, max(buckets), how.context, max([1, *ks, *ragged]) + 1) as reqs:
        warm_graphs(engine.runner, accept, reqs, buckets, [k for k in ks if k > 0], ragged=ragged)
    return buckets


def capture_serving_graphs(engine: EngineView, accept: AcceptRule, ks: Sequence[int]) -> dict:
    """On an idle engine with graphs: the one-token step, per K in `ks` (policy=budget: every K up to the
    largest, and the ragged buckets) the drafter and the verify, every prefill shape; then the graphs
    freeze. {graphs, prefill_graphs (held), seconds, bytes (CUDA memory the graph pools reserved)}."""
    graphs, ragged, cuda = engine.runner.graphs, [], engine.device.type == "cuda"
    if not graphs.enabled:
        return {"graphs": 0, "prefill_graphs": 0, "seconds": 0.0, "bytes": 0}
    if engine.levers.policy == "budget" and ks and max(ks) > 0:
        spans = ragged_spans(engine.drafts_per_round)
        ragged, ks = [s for s in spans if s <= min(s for s in spans if s > max(ks))], range(1, max(ks) + 1)
    if cuda:  # cached free blocks would count as graph memory (or, released mid-way, as negative)
        torch.cuda.synchronize(engine.device), torch.cuda.empty_cache()
    reserved = torch.cuda.memory_reserved(engine.device) if cuda else 0
    before, start = graphs.captures, time.perf_counter()
    buckets = _capture(engine, accept, ks, ragged)
    graphs.frozen = False  # frozen again just below, whatever happens
    try:
        tokens = max(engine.config.max_num_batched_tokens, engine.max_model_len)
        warm_prefill(engine.runner, prefill_shapes(buckets, tokens))
    finally:
        graphs.frozen = True
    report = dict(graphs=graphs.captures - before, prefill_graphs=sum(k[0] == "prefill" for k in graphs.captured))
    report.update(seconds=time.perf_counter() - start)
    report["bytes"] = torch.cuda.memory_reserved(engine.device) - reserved if cuda else 0
    log.info("serving graphs: %(graphs)d (%(prefill_graphs)d prefill) in %(seconds).2f s, %(bytes)d B of pool", report)
    return report


def capture_policy_graphs(engine: EngineView, accept: AcceptRule) -> int:
    """Once, on an idle engine with graphs: every (bucket, variant) graph the adaptive policy's rounds can
    replay, up to the batch the KV pool admits. Returns the graphs captured (0: none, busy, or done)."""
    graphs = engine.runner.graphs
    if not graphs.enabled or graphs.policy_captured or engine.scheduler.has_work():
        return 0
    before, start = graphs.captures, time.perf_counter()
    buckets = _capture(engine, accept, None)
    graphs.policy_captured, captured, seconds = True, graphs.captures - before, time.perf_counter() - start
    log.info("policy graphs: %d captured over %d buckets in %.2f s", captured, len(buckets), seconds)
    return captured
