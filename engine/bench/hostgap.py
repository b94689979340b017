"""Where a closed-loop run's wall goes outside the PhaseTimer's steps (the sweep's `wall_s` minus its
`steps_ms`): per run, the engine work around the timed steps, timed from outside by wrapping this
engine instance's own methods (add_request, the scheduler's schedule and release, the runner's
assign_blocks, _report), and the cyclic GC's collections. Nothing in the engine changes.

    python -m engine.bench hostgap --geometry 4b --concurrency 256 --runs 8 --out DIR [--frozen-heap]

Bench-only, on the known-continuation target of the geometry (the study's plain arm).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

from engine.bench.common import add_device_args, make_engine, random_prompts, resolve_device, setup_logging, torch_dtype
from engine.bench.gcstate import frozen_heap
from engine.bench.known_pair import known_target
from engine.bench.load import closed_loop
from engine.bench.report import write_csv
from engine.engine import Engine

log = logging.getLogger(__name__)

PARTS = ("add", "schedule", "assign", "report", "release")


class Stopwatch:
    """ms summed per part over calls of wrapped methods of one engine instance, until detached."""

    def __init__(self, engine: Engine):
        self.ms = dict.fromkeys(PARTS, 0.0)
        self._wrapped = []
        owners = {"add": (engine, "add_request"), "schedule": (engine.scheduler, "schedule")}
        owners |= {"assign": (engine.runner, "assign_blocks"), "report": (engine, "_report")}
        owners["release"] = (engine.scheduler, "release")
        for part, (obj, name) in owners.items():
            setattr(obj, name, self._timed(part, getattr(obj, name)))
            self._wrapped.append((obj, name))

    def _timed(self, part: str, fn):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.ms[part] += (time.perf_counter() - t0) * 1e3

        return timed

    def detach(self) -> None:
        for obj, name in self._wrapped:
            delattr(obj, name)  # the class's method again
        self._wrapped = []


def gap_runs(engine: Engine, prompts: Sequence[Sequence[int]], c: int, runs: int, new_tokens: int) -> list[dict]:
    """`runs` closed-loop runs of one wave of c requests (after one untimed), one row each: wall and
    steps ms, the gap between them, the parts of it, the rest (the loop's own work, the step's
    bookkeeping), and the run's GC collections (wherever they fell)."""
    watch = Stopwatch(engine)
    rows = []
    try:
        closed_loop(engine, prompts, c, c, new_tokens)
        for i in range(runs):
            watch.ms = dict.fromkeys(PARTS, 0.0)
            res = closed_loop(engine, prompts, c, c, new_tokens, first=(i + 1) * c)
            wall, steps = res.wall_s * 1e3, sum(s.total for s in res.steps)
            parts = {f"{p}_ms": watch.ms[p] for p in PARTS}
            row = {"run": i, "concurrency": c, "wall_ms": wall, "steps_ms": steps, "gap_ms": wall - steps, **parts}
            rows.append(
                {**row, "rest_ms": wall - steps - sum(parts.values()), "gc_ms": res.gc_ms, "gc_full": res.gc_full}
            )
    finally:
        watch.detach()
    return rows


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine.bench hostgap", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--geometry", default="4b", help="4b or a fixture recipe's shapes: tiny, small")
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--runs", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--frozen-heap", action="store_true", help="run under gcstate.frozen_heap, as the sweep does")
    p.add_argument("--seed", type=int, default=0)
    add_device_args(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    setup_logging(args.verbose)
    if min(args.concurrency, args.runs, args.prompt_len) < 1 or args.new_tokens < 2:
        raise SystemExit("--concurrency, --runs and --prompt-len must be >= 1 and --new-tokens >= 2")
    device = resolve_device(args.device)
    target = known_target(args.geometry, device, torch_dtype(args.dtype, device), args.seed)
    seq = args.prompt_len + args.new_tokens
    engine = make_engine(target, None, args, device, max_num_seqs=args.concurrency, seq_tokens=seq)
    vocab = engine.target_cfg.geometry.vocab_size
    prompts = random_prompts((args.runs + 1) * args.concurrency, args.prompt_len, vocab, args.seed + 1)
    with frozen_heap() if args.frozen_heap else contextlib.nullcontext():
        rows = gap_runs(engine, prompts, args.concurrency, args.runs, args.new_tokens)
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "hostgap.csv", rows)
    for key in ("wall_ms", "steps_ms", "gap_ms", *(f"{p}_ms" for p in PARTS), "rest_ms", "gc_ms"):
        got = [r[key] for r in rows]
        log.info("%-11s median %8.2f  min %8.2f  max %8.2f", key, statistics.median(got), min(got), max(got))
    log.info("full collections: %d in %d runs; wrote %s", sum(r["gc_full"] for r in rows), len(rows), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
