"""The adaptive policy's cost table measured on the engine's own device (graph replays on the GPU, eager
forwards on CPU), cached per key under $PEGASPEC_CACHE/costs (default ~/.cache/pegaspec/costs, one JSON file
each, under a file lock)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import platform
import statistics
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import torch
from filelock import FileLock

from engine.knobs import read_gate_knobs
from engine.policy.costs import CostTable
from engine.policy.warmup import CalibrationPlan, EngineView, dummy_requests, plan_calibration
from engine.request import Request
from engine.runner import AcceptRule, ModelRunner
from engine.timing import time_ms

log = logging.getLogger(__name__)

# (samples per point: the median is kept, forwards per sample, warm-up calls: the first captures)
GRAPH_TIMING, EAGER_TIMING = (3, 2, 2), (2, 1, 1)
FORMAT = 2  # the cache file's layout version


def time_forwards(
    runner: ModelRunner,
    accept: AcceptRule,
    reqs: Sequence[Request],
    batches: Sequence[int],
    spans: Sequence[int],
    repeats: int,
    iters: int,
    time_budget_s: float | None = None,
    warmup: int = 2,
    required: Sequence[int] = (1,),
) -> list[dict]:
    """Rows {kind: verify|draft, batch, span, context, rows, bucket, ms (median), ms_min, ms_max} over the
    first `batch` of `reqs`: the verify per span, the drafter (span: its LM head's positions) at all drafts
    and each K; the `required` spans' rows first, then whole (kind, span) groups within the time budget."""
    device, vocab = runner.device, runner.target.g.vocab_size
    gen = torch.Generator().manual_seed(1)
    full = [runner.drafter.cfg.drafts_per_round] if runner.drafter is not None else []
    heads = [s - 1 for s in spans if full and 1 < s < 1 + full[0]]  # else costed as the full head
    must = {("verify", s) for s in required} | {("draft", s - 1) for s in required} | {("draft", k) for k in full}
    groups = sorted([("verify", s) for s in spans] + [("draft", k) for k in full + heads], key=lambda g: g not in must)
    least = sum(g in must for g in groups)  # the least table the policy takes

    def forward(sub: list[Request], span: int, drafts: torch.Tensor | None) -> None:
        runner.stage(sub, None if drafts is None else [span - 1] * len(sub))
        if drafts is None:
            runner.draft(sub, span)
        else:
            runner.verify(sub, drafts, span - 1, accept)

    rows, start = [], time.perf_counter()
    for i, (kind, span) in enumerate(groups):
        if i >= least and time_budget_s is not None and time.perf_counter() - start > time_budget_s:
            log.warning("time budget: stopped after %d of %d points", len(rows), len(batches) * len(groups))
            break
        for b in batches:
            sub = list(reqs[:b])
            drafts = torch.randint(0, vocab, (b, span - 1), generator=gen).to(device) if kind == "verify" else None
            samples = time_ms(partial(forward, sub, span, drafts), device, repeats, iters, warmup)  # the first captures
            context = sum(r.num_kv for r in sub) // b  # tokens in each request's cache
            row = dict(kind=kind, batch=b, span=span, context=context, rows=b * span, bucket=runner.graphs.rows(b))
            rows.append(row | dict(ms=statistics.median(samples), ms_min=min(samples), ms_max=max(samples)))
            log.debug("%s batch %d span %d: %.3f ms", kind, b, span, rows[-1]["ms"])
    runner.reset()  # nothing staged stays pointing at these requests
    return rows


def cache_key(engine: EngineView, how: CalibrationPlan) -> dict:
    """What a measured table depends on; a cached table is reused only for an equal key."""
    device, graphs = engine.device, engine.runner.graphs
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    try:
        import triton
    except ImportError:
        triton = None
    key = dict(format=FORMAT, device=f"{device.type}:{name}", target=dataclasses.asdict(engine.target_cfg.geometry))
    key.update(drafter=dataclasses.asdict(engine.draft_cfg) if engine.draft_cfg else None, dtype=str(engine.dtype))
    key.update({k: getattr(engine.config, k) for k in ("backend", "batch_invariant", "max_num_seqs", "kv_block_size")})
    key.update(graphs=graphs.enabled, buckets=graphs.buckets, **dataclasses.asdict(how))
    return key | dict(torch=torch.__version__, triton=getattr(triton, "__version__", None))


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


def calibrated_table(engine: EngineView, accept: AcceptRule) -> CostTable:
    """The engine's cost table: cached for its key, else measured now on the idle engine (at the plan's
    context, then its long one) and cached (one process calibrates; another waiting on the lock then
    reads its file)."""
    how = plan_calibration(engine)
    key = cache_key(engine, how)
    path = cache_path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        table = read_cached(path, key)
        if table is not None:
            log.info("cost table: cache hit %s", path)
            return table
        start, rows = time.perf_counter(), []
        repeats, iters, warmup = GRAPH_TIMING if engine.runner.graphs.enabled else EAGER_TIMING
        for batches, context in ((how.batches, how.context), (how.long_batches, how.long_context)):
            if batches:
                with dummy_requests(engine, max(batches), context, max(how.spans)) as reqs:
                    rows += time_forwards(
                        engine.runner, accept, reqs, batches, how.spans, repeats, iters, warmup=warmup
                    )
        table, wall = CostTable.from_rows(rows), time.perf_counter() - start
        tmp = path.with_suffix(".tmp")  # written whole under the lock, then renamed
        record = {"key": key, "rows": rows, "wall_s": wall, "created": time.time()}
        tmp.write_text(json.dumps(record, indent=1, default=str))
        os.replace(tmp, path)
    log.info("cost table: calibrated %d points in %.2f s on %s, cached at %s", len(rows), wall, key["device"], path)
    return table
