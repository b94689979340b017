"""The adaptive policy's cost table, measured by the engine on its own device (SPEC 9).

`time_forwards` times one target verify (per batch and span) and one drafter forward (per batch) on
requests already in the cache: CUDA-graph replays of the engine's own step functions on the GPU
(the graphs the rounds replay later), eager forwards on CPU. `engine.bench profile` uses it too.

`calibrated_table` gives an idle engine its table: read from the cache when one was measured for the
same device, geometry, dtype, graph buckets, spans and library versions, else measured on dummy
requests that take free slots and KV blocks and hand them back afterwards (no request, counter or
request index of the engine changes), then cached. The cache lives under $PEGASPEC_CACHE/costs
(default ~/.cache/pegaspec/costs), one JSON file per key, written under a file lock.

The host term (host_a, host_b) stays 0: the per-request host work of a round (settling, the
scheduler, the trace) runs on live requests only, so dummy rows cannot time it; the policy learns it
online from the rounds' walls instead (engine/host_term.py HostTerm).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Protocol

import torch
from filelock import FileLock

from engine.config import EngineConfig, SamplingParams
from engine.costs import CostTable
from engine.knobs import read_gate_knobs
from engine.kv_cache import BlockManager
from engine.models.config import DFlashConfig, Qwen3Config
from engine.policy import SPAN_VARIANTS
from engine.request import Finish, Request
from engine.round import Rounds
from engine.runner import ModelRunner
from engine.scheduler import Plan, Scheduler
from engine.timing import time_ms

log = logging.getLogger(__name__)

CONTEXT = 64  # tokens in each dummy request's cache: a short decode context
# (samples per point: the median is kept, forwards per sample, warm-up calls: the first captures)
GRAPH_TIMING, EAGER_TIMING = (3, 2, 2), (2, 1, 1)
FORMAT = 1  # the cache file's layout version


class EngineView(Protocol):
    """The parts of engine.Engine a calibration reads (engine.py imports this module)."""

    config: EngineConfig
    device: torch.device
    dtype: torch.dtype
    target_cfg: Qwen3Config
    draft_cfg: DFlashConfig | None
    drafter: object | None
    runner: ModelRunner
    rounds: Rounds
    scheduler: Scheduler
    blocks: BlockManager
    max_model_len: int

    @property
    def drafts_per_round(self) -> int: ...


def time_forwards(
    engine: EngineView,
    reqs: Sequence[Request],
    batches: Sequence[int],
    spans: Sequence[int],
    repeats: int,
    iters: int,
    time_budget_s: float | None = None,
    warmup: int = 2,
) -> list[dict]:
    """Rows {kind: verify|draft, batch, span, rows, bucket, ms (median), ms_min, ms_max} for the first
    `batch` of `reqs` (prefilled, draft-ready); verify at every span, the drafter at each batch."""
    runner, device = engine.runner, engine.device
    vocab = engine.target_cfg.geometry.vocab_size
    gen = torch.Generator().manual_seed(1)
    # Span 1 and the drafter first: a time budget that cuts the rest still leaves a table the policy takes.
    points = [("verify", b, 1) for b in batches if 1 in spans]
    if engine.drafter is not None:
        points += [("draft", b, engine.drafts_per_round) for b in batches]
    points += [("verify", b, s) for s in spans if s != 1 for b in batches]
    rows, start = [], time.perf_counter()
    for kind, b, span in points:
        if time_budget_s is not None and time.perf_counter() - start > time_budget_s:
            log.warning("time budget: stopped after %d of %d points", len(rows), len(points))
            break
        sub = list(reqs[:b])
        if kind == "verify":
            drafts = torch.randint(0, vocab, (b, span - 1), generator=gen).to(device)

            def fn(sub=sub, drafts=drafts, k=span - 1):
                runner.stage(sub, [k] * len(sub))
                return runner.verify(sub, drafts, k, engine.rounds.accept)
        else:

            def fn(sub=sub):
                runner.stage(sub)
                return runner.draft(sub)

        samples = time_ms(fn, device, repeats, iters, warmup)  # the first call captures the graph
        ms = statistics.median(samples)
        rows.append(
            {
                "kind": kind,
                "batch": b,
                "span": span,
                "rows": b * span,
                "bucket": runner.graphs.rows(b),  # padded rows
                "ms": ms,
                "ms_min": min(samples),
                "ms_max": max(samples),
            }
        )
        log.debug("%s batch %d span %d: %.3f ms", kind, b, span, ms)
    runner.reset()  # nothing staged stays pointing at these requests
    return rows


def policy_spans(per_round: int) -> list[int]:
    """Verify spans the policy can choose: 1 + K for K in the span variants and all drafts."""
    return sorted({1 + k for k in (*SPAN_VARIANTS, per_round) if k <= per_round})


@dataclasses.dataclass(frozen=True)
class CalibrationPlan:
    """What a calibration measures: dummy requests of `context` tokens, verify spans, batches."""

    context: int
    spans: list[int]
    batches: list[int]


def plan_calibration(engine: EngineView, context: int = CONTEXT) -> CalibrationPlan:
    """The policy's spans; powers of two up to max_num_seqs and max_num_seqs itself (graph buckets
    all), as many as the free KV pool holds; the context shortened to what max_model_len admits."""
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
    return CalibrationPlan(context, spans, sorted({1 << i for i in range(most.bit_length())} | {most}))


def _require_idle(engine: EngineView) -> None:
    if engine.scheduler.has_work():
        raise RuntimeError(f"calibration needs an idle engine: {engine.scheduler.describe()}")


def _dummy(i: int, context: int, budget: int, vocab: int) -> Request:
    ids = [(7 * i + 3 * t + 1) % vocab for t in range(context)]  # any in-vocabulary ids: only costs are read
    return Request(-1 - i, ids, SamplingParams(temperature=0, max_tokens=budget + 1, ignore_eos=True), frozenset())


@contextlib.contextmanager
def dummy_requests(engine: EngineView, count: int, context: int, budget: int) -> Iterator[list[Request]]:
    """`count` prefilled, draft-ready requests of `context` tokens with KV reserved for `budget` more
    rows, outside the engine's request table; their slots and blocks are handed back on exit."""
    _require_idle(engine)  # a busy scheduler could plan a step of live requests here
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


def calibrate(engine: EngineView, how: CalibrationPlan) -> tuple[CostTable, list[dict]]:
    """Measure the table on the idle engine: (table, profile rows)."""
    with dummy_requests(engine, max(how.batches), how.context, max(how.spans)) as reqs:
        repeats, iters, warmup = GRAPH_TIMING if engine.runner.graphs.enabled else EAGER_TIMING
        rows = time_forwards(engine, reqs, how.batches, how.spans, repeats, iters, warmup=warmup)
    return CostTable.from_rows(rows), rows


def cache_key(engine: EngineView, how: CalibrationPlan) -> dict:
    """What a measured table depends on; a cached table is reused only for an equal key."""
    device = engine.device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "format": FORMAT,
        "device": f"{device.type}:{name}",
        "target": dataclasses.asdict(engine.target_cfg.geometry),
        "drafter": dataclasses.asdict(engine.draft_cfg) if engine.draft_cfg else None,
        "dtype": str(engine.dtype),
        "backend": engine.config.backend,  # "auto" is one backend per device type
        "batch_invariant": engine.config.batch_invariant,
        "graphs": engine.runner.graphs.enabled,
        "buckets": engine.runner.graphs.buckets,
        "max_num_seqs": engine.config.max_num_seqs,
        "kv_block_size": engine.config.kv_block_size,
        **dataclasses.asdict(how),
        "torch": torch.__version__,
        "triton": triton_version,
    }


def cache_path(key: dict) -> Path:
    env = read_gate_knobs().cache
    root = Path(env).expanduser() if env else Path.home() / ".cache" / "pegaspec"
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]
    return root / "costs" / f"{digest}.json"


def read_cached(path: Path, key: dict) -> CostTable | None:
    """The cached table at `path` for `key`; None when absent, and a warning when unreadable."""
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        if data["key"] != json.loads(json.dumps(key, default=str)):
            raise ValueError("its key differs from this engine's")
        return CostTable.from_rows(data["rows"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        log.warning("cost table cache %s unreadable (%s: %s): calibrating again", path, type(err).__name__, err)
        return None


def calibrated_table(engine: EngineView) -> CostTable:
    """The engine's cost table: cached for its key, else calibrated now and cached (one process
    calibrates; another waiting on the lock then reads its file)."""
    how = plan_calibration(engine)
    key = cache_key(engine, how)
    path = cache_path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        table = read_cached(path, key)
        if table is not None:
            log.info("cost table: cache hit %s", path)
            return table
        start = time.perf_counter()
        table, rows = calibrate(engine, how)
        wall = time.perf_counter() - start
        _write_atomic(path, {"key": key, "rows": rows, "wall_s": wall, "created": time.time()})
    log.info("cost table: calibrated %d points in %.2f s on %s, cached at %s", len(rows), wall, key["device"], path)
    return table


def _write_atomic(path: Path, data: dict) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, default=str)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
