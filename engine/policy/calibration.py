"""The adaptive policy's cost table, measured by the engine on its own device: `time_forwards` times the
target verify per (batch, span) and the drafter forward per batch on requests in the cache (graph
replays on the GPU, eager on CPU). `calibrated_table` reads the table cached for this engine's key under
$PEGASPEC_CACHE/costs (default ~/.cache/pegaspec/costs, one JSON file per key, under a file lock), else
measures it on dummy requests and caches it. Its host term stays 0: the policy learns it online."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Sequence
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
    """Rows {kind: verify|draft, batch, span, context, rows, bucket, ms (median), ms_min, ms_max} for the first
    `batch` of `reqs` (prefilled, draft-ready); verify at every span, the drafter at each batch (span:
    the positions its LM head ran over). Whatever the time budget, the `required` spans' verify and
    drafter rows (the full drafter, each required K's head) are measured at every batch; the budget cuts
    only whole (kind, span) groups after them."""
    device, vocab = runner.device, runner.target.g.vocab_size
    gen = torch.Generator().manual_seed(1)
    must = [s for s in spans if s in required]  # span 1 and the full drafter: the least table the policy takes
    points = [("verify", b, s) for s in must for b in batches]
    heads: list[int] = []
    if runner.drafter is not None:  # the head over each verified K (else costed as the full head)
        per_round = runner.drafter.cfg.drafts_per_round
        heads = [s - 1 for s in spans if 1 < s < 1 + per_round]
        points += [("draft", b, k) for k in [per_round, *(k for k in heads if k + 1 in must)] for b in batches]
    first_optional = len(points)
    points += [("verify", b, s) for s in spans if s not in must for b in batches]
    points += [("draft", b, k) for k in heads if k + 1 not in must for b in batches]
    rows, start = [], time.perf_counter()
    for i, (kind, b, span) in enumerate(points):
        new_group = i == 0 or points[i - 1][::2] != (kind, span)
        over = time_budget_s is not None and time.perf_counter() - start > time_budget_s
        if i >= first_optional and new_group and over:
            log.warning("time budget: stopped after %d of %d points", len(rows), len(points))
            break
        sub = list(reqs[:b])
        if kind == "verify":
            drafts = torch.randint(0, vocab, (b, span - 1), generator=gen).to(device)

            def fn(sub=sub, drafts=drafts, k=span - 1):
                runner.stage(sub, [k] * len(sub))
                return runner.verify(sub, drafts, k, accept)
        else:

            def fn(sub=sub, heads=span):
                runner.stage(sub)
                return runner.draft(sub, heads)

        samples = time_ms(fn, device, repeats, iters, warmup)  # the first call captures the graph
        ms = statistics.median(samples)
        rows.append(
            {
                "kind": kind,
                "batch": b,
                "span": span,
                "context": sum(r.num_kv for r in sub) // b,  # tokens in each request's cache
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


def calibrate(engine: EngineView, accept: AcceptRule, how: CalibrationPlan) -> tuple[CostTable, list[dict]]:
    """Measure the table on the idle engine: (table, profile rows)."""
    runner = engine.runner
    repeats, iters, warmup = GRAPH_TIMING if runner.graphs.enabled else EAGER_TIMING
    with dummy_requests(engine, max(how.batches), how.context, max(how.spans)) as reqs:
        rows = time_forwards(runner, accept, reqs, how.batches, how.spans, repeats, iters, warmup=warmup)
    if how.long_batches:  # the context axis: the same graphs at a longer context
        with dummy_requests(engine, max(how.long_batches), how.long_context, max(how.spans)) as reqs:
            rows += time_forwards(runner, accept, reqs, how.long_batches, how.spans, repeats, iters, warmup=warmup)
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


def calibrated_table(engine: EngineView, accept: AcceptRule) -> CostTable:
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
        table, rows = calibrate(engine, accept, how)
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
