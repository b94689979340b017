"""KV policy under pressure: admission on the prompt with preemption by recompute vs reserving every
request's whole budget at admission, on one engine, runs interleaved round by round.

    python -m engine.bench preempt --recipe small --out DIR --concurrency 64 --new-tokens 1024 \
        --pool-requests 16 --rounds 3
"""

from __future__ import annotations

import argparse
import logging
import statistics
from collections.abc import Sequence
from pathlib import Path

from engine.bench.closed_loop import closed_loop, plan_counts
from engine.bench.common import (
    BLOCK,
    add_device_args,
    add_weight_args,
    drafter_block,
    load_prompts,
    make_engine,
    resolve_device,
    seq_blocks,
    setup_logging,
    weights_of,
)
from engine.bench.meta import meta_lines, run_meta
from engine.bench.report import fmt, markdown_table, write_csv, write_json
from engine.engine import Engine
from engine.scheduler import Plan

log = logging.getLogger(__name__)

ARMS = ("reserve", "preempt")


def pool_engine(target: Path, drafter: Path | None, args: argparse.Namespace, seq_tokens: int) -> Engine:
    """max_num_seqs = concurrency, and a KV pool of exactly pool_requests full-length sequences (refused
    where it does not fit the memory budget)."""
    headroom = drafter_block(drafter) if drafter else 0
    pool = seq_blocks(args.pool_requests, seq_tokens + headroom + 1)
    grid = f"{args.pool_requests} pooled sequences of {seq_tokens + headroom + 1} tokens"
    size = dict(max_num_seqs=args.concurrency, seq_tokens=seq_tokens, headroom=headroom)
    return make_engine(target, drafter, args, resolve_device(args.device), **size, blocks=pool, grid=grid)


def run_arm(engine: Engine, arm: str, prompts: Sequence[Sequence[int]], args: argparse.Namespace, first: int) -> dict:
    engine.scheduler.reserve_budget = arm == "reserve"
    before = engine.preemptions
    res = closed_loop(engine, prompts, args.concurrency, args.requests, args.new_tokens, first=first)
    decode = [s.batch for s in res.steps if s.plan != Plan.PREFILL.value]
    plans = plan_counts(res.steps)
    row = dict(arm=arm, requests=res.requests, output_tokens=res.output_tokens, wall_s=res.wall_s, tok_s=res.tok_s)
    row.update(mean_decode_batch=statistics.fmean(decode) if decode else 0.0, max_decode_batch=max(decode, default=0))
    row.update(preemptions=engine.preemptions - before, prefill_steps=plans.get(Plan.PREFILL.value, 0))
    return row | dict(decode_side_steps=len(decode), committed_tokens=res.stats.committed_tokens)


def run_bench(engine: Engine, prompts: Sequence[Sequence[int]], args: argparse.Namespace) -> list[dict]:
    """One warm-up round (discarded), then `rounds` rounds; round r starts with arm r mod 2 and both
    arms of a round get the same prompts."""
    rows = []
    for r in range(args.rounds + 1):
        order = ARMS if r % 2 == 0 else ARMS[::-1]
        for slot, arm in enumerate(order):
            row = run_arm(engine, arm, prompts, args, first=r * args.requests)
            log.info("round %d %s: %.1f tok/s, %d preemptions", r, arm, row["tok_s"], row["preemptions"])
            if r:
                rows.append({"round": r, "slot": slot, **row})
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    """Medians per arm, and the median of the per-round preempt / reserve throughput ratio."""
    by_round = {(r["round"], r["arm"]): r for r in rows}
    rounds = sorted({r["round"] for r in rows})
    ratios = [by_round[(n, "preempt")]["tok_s"] / by_round[(n, "reserve")]["tok_s"] for n in rounds]
    out = []
    for arm in ARMS:
        mine = [r for r in rows if r["arm"] == arm]
        tok_s = [r["tok_s"] for r in mine]
        s = dict(arm=arm, rounds=len(mine), tok_s_median=statistics.median(tok_s), tok_s_min=min(tok_s))
        s.update(tok_s_max=max(tok_s), mean_decode_batch=statistics.median(r["mean_decode_batch"] for r in mine))
        s.update(preemptions=statistics.median(r["preemptions"] for r in mine))
        out.append(s | dict(ratio_vs_reserve=statistics.median(ratios) if arm == "preempt" else 1.0))
    return out


def table(summary: list[dict]) -> str:
    header = ["arm", "tok/s median", "min..max", "mean decode batch", "preemptions / run", "vs reserve"]
    rows = [
        [s["arm"], fmt(s["tok_s_median"]), f"{fmt(s['tok_s_min'])}..{fmt(s['tok_s_max'])}", fmt(s["mean_decode_batch"])]
        + [fmt(s["preemptions"], 0), f"{s['ratio_vs_reserve']:.3f}x"]
        for s in summary
    ]
    return markdown_table(header, rows)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine.bench preempt", description=__doc__.split("\n\n")[0])
    add_weight_args(p, "speculate (omit for a plain target)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--concurrency", type=int, default=64, help="requests in flight (and max_num_seqs)")
    p.add_argument("--requests", type=int, default=None, help="requests per run (default: the concurrency)")
    p.add_argument("--new-tokens", type=int, default=1024)
    p.add_argument("--pool-requests", type=int, default=16, help="full-length sequences the KV pool holds")
    p.add_argument("--max-prompt-len", type=int, default=None, help="keep the first N tokens of each prompt")
    p.add_argument("--rounds", type=int, default=3, help="measured rounds (+1 warm-up), both arms each")
    add_device_args(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    setup_logging(args.verbose)
    args.requests = args.requests or args.concurrency
    for name in ("concurrency", "requests", "new_tokens", "pool_requests", "rounds"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    device = resolve_device(args.device)
    target, drafter, prompt_path = weights_of(args, device)
    prompts = load_prompts(prompt_path, target, args.max_prompt_len)
    engine = pool_engine(target, drafter, args, max(len(p) for p in prompts) + args.new_tokens)
    rows = run_bench(engine, prompts, args)
    summary = summarize(rows)
    meta = run_meta("preempt", device, list(argv) if argv is not None else None)
    meta.update(target=str(target), drafter=str(drafter), pool_blocks=engine.scheduler.blocks.capacity)
    write_csv(args.out / "preempt.csv", rows)
    write_csv(args.out / "preempt_summary.csv", summary)
    write_json(args.out / "preempt.json", {**meta, "summary": summary})
    setting = (
        f"- c={args.concurrency}, {args.requests} requests/run, {args.new_tokens} new tokens, KV pool "
        f"{meta['pool_blocks']} blocks of {BLOCK} (~{args.pool_requests} full-length requests), {args.rounds} rounds\n"
    )
    md = table(summary)
    (args.out / "preempt.md").write_text(f"# KV: preemption vs reservation\n\n{meta_lines(meta)}{setting}\n{md}\n")
    print(md)
    print(f"wrote {args.out}/preempt.csv, preempt_summary.csv, preempt.md, preempt.json")
    return 0
