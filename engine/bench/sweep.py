"""The lever sweep: offline closed-loop load per concurrency, lever arms interleaved round by round on
one set of weights (a plain engine + one speculative engine whose levers switch between runs).

    python -m engine.bench sweep --recipe small --out DIR --concurrency 1 4 8 16 32 64 \
        --arms plain spec spec+trim=4 spec+gate=32 spec+policy=adaptive --noise-arm --rounds 8 --new-tokens 128
"""

from __future__ import annotations

import argparse
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from tqdm import tqdm

from engine.bench.arms import SPEC, SPEC_NOISE_ARM, Arm, parse_arms, round_order
from engine.bench.closed_loop import (
    LoadResult,
    acceptance_histogram,
    closed_loop,
    mean_batch,
    output_lengths,
    phase_split,
    plan_counts,
)
from engine.bench.common import (
    add_device_args,
    add_weight_args,
    engine_pair,
    load_prompts,
    resolve_device,
    setup_logging,
    weights_of,
)
from engine.bench.gcstate import frozen_heap
from engine.bench.meta import meta_lines, run_meta
from engine.bench.plots import sweep_plot
from engine.bench.policy_report import adaptive_markdown
from engine.bench.policy_state import host_residuals, policy_counts, policy_host, residual_summary
from engine.bench.report import write_csv, write_json
from engine.bench.summary import add_paired_ratios, noise_floors, summarize, sweep_markdown
from engine.engine import Engine
from engine.scheduler import Plan

log = logging.getLogger(__name__)


def engine_for(arm: Arm, engines: dict[str, Engine]) -> Engine:
    if arm.is_plain:
        return engines["plain"]
    engine = engines.get("spec")
    if engine is None:
        raise ValueError(f"arm {arm.label!r} needs a drafter (--drafter or --recipe)")
    engine.set_levers(**arm.levers())  # the first adaptive arm calibrates the engine's cost table
    return engine


def round_row(
    c: int,
    round_index: int,
    slot: int,
    seq: int,
    arm: Arm,
    res: LoadResult,
    chosen: Counter | None = None,
    host_terms: str = "",
    probes: Counter | None = None,
    residuals: str = "",
    launched_ahead: int | None = None,
) -> dict:
    """One sweep.csv row (its columns: the benchmarks README, "sweep"); slot: the arm's position in its
    round, seq: the global run order; the adaptive arm's K per round (chosen), host terms, probes and
    residuals; launched_ahead: the one-token steps launched before the host read the step before."""
    s, plans = res.stats, plan_counts(res.steps)
    spec_rounds = s.rounds - s.gated_rounds
    row = dict(concurrency=c, round=round_index, slot=slot, seq=seq, arm=arm.label, requests=res.requests)
    row.update(output_tokens=res.output_tokens, wall_s=res.wall_s, tok_s=res.tok_s, ratio_vs_plain=None)
    row.update(max_in_flight=res.max_in_flight, mean_batch=mean_batch(res.steps), steps=len(res.steps))
    row.update(prefill_steps=plans.get(Plan.PREFILL.value, 0), decode_steps=plans.get(Plan.DECODE.value, 0))
    row.update(spec_steps=plans.get(Plan.SPECULATIVE.value, 0), gated_steps=plans.get(Plan.GATED.value, 0))
    row.update(request_rounds=s.rounds, gated_rounds=s.gated_rounds, launched_ahead=launched_ahead)
    row.update(committed_tokens=s.committed_tokens, drafts_verified=s.draft_tokens_verified)
    row.update(drafts_accepted=s.draft_tokens_accepted)
    row["tokens_per_round"] = (s.committed_tokens - s.gated_rounds) / spec_rounds if spec_rounds else None
    row["accept_hist"] = " ".join(str(v) for v in acceptance_histogram(s)) if s.drafts else ""
    row["span_choices"] = " ".join(f"{k}:{n}" for k, n in sorted((chosen or {}).items()))
    row.update(host_terms=host_terms, host_residuals=residuals)
    row["probes"] = " ".join(f"{b}:{k}:{n}" for (b, k), n in sorted((probes or {}).items()))  # batch:K:rounds
    row.update(phase_split(res.steps))
    return row | dict(peak_mem_gib=res.peak_mem_gib, gc_ms=res.gc_ms, gc_full=res.gc_full)


def run_sweep(
    engines: dict[str, Engine],
    arms: Sequence[Arm],
    prompts: Sequence[Sequence[int]],
    concurrency: Sequence[int],
    rounds: int,
    new_tokens: int | Sequence[int],
    waves: int = 2,
    time_budget_s: float | None = None,
    progress: bool = True,
    before_arm: Callable[[Arm], None] | None = None,
) -> tuple[list[dict], dict[int, int]]:
    """Rows (one per measured arm-run) and {c: rounds run} where the budget trimmed rounds: per c a
    warm-up round, then `rounds` rounds, round r from arm r mod n on prompts from r * waves * c, on a
    frozen heap (the benchmarks README, "sweep"); new_tokens: one or per prompt; before_arm(arm) hook."""
    rows: list[dict] = []
    trimmed: dict[int, int] = {}
    seq, start = 0, time.perf_counter()
    bar = tqdm(
        total=len(concurrency) * (rounds + 1) * len(arms), disable=not progress, unit="run", desc="sweep", mininterval=5
    )
    with frozen_heap():
        for ci, c in enumerate(concurrency):
            now = time.perf_counter()
            deadline = None if time_budget_s is None else now + (start + time_budget_s - now) / (len(concurrency) - ci)
            slowest = 0.0
            for r in range(rounds + 1):
                if deadline is not None and r >= 2 and time.perf_counter() + slowest > deadline:
                    log.warning("time budget: c=%d ran %d of %d rounds", c, r - 1, rounds)
                    trimmed[c] = r - 1
                    bar.update((rounds + 1 - r) * len(arms))
                    break
                bar.set_postfix_str(f"c={c} round={'warm-up' if r == 0 else r}")
                t0 = time.perf_counter()
                for slot, arm in enumerate(round_order(arms, r)):
                    # Each round takes the next window of prompts; every arm of a round gets the same one.
                    engine = engine_for(arm, engines)
                    if before_arm:
                        before_arm(arm)
                    (before, probed), ahead = policy_counts(engine), engine.rounds.overlap.used
                    with host_residuals(engine) as walls:
                        res = closed_loop(engine, prompts, c, waves * c, new_tokens, first=r * waves * c)
                    bar.update(1)
                    if r:
                        chosen, probes = policy_counts(engine)
                        chosen, probes = chosen - before, probes - probed
                        host = policy_host(engine) if chosen else ""
                        residuals = residual_summary(walls) if chosen else ""
                        ahead = engine.rounds.overlap.used - ahead
                        rows.append(round_row(c, r, slot, seq, arm, res, chosen, host, probes, residuals, ahead))
                        seq += 1
                if r:
                    slowest = max(slowest, time.perf_counter() - t0)
    bar.close()
    add_paired_ratios(rows)
    return rows, trimmed


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine.bench sweep", description=__doc__.split("\n\n")[0])
    add_weight_args(p)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8, 16, 32, 64])
    p.add_argument("--arms", nargs="+", default=["plain", "spec", "spec+trim=4", "spec+trim=8"])
    p.add_argument("--noise-arm", action="store_true", help="add plain#2, the paired noise floor")
    p.add_argument("--spec-noise-arm", action="store_true", help="add spec#2, the speculative arms' noise floor")
    p.add_argument("--rounds", type=int, default=8, help="measured rounds per concurrency (+1 warm-up)")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--length-spread", type=float, default=0.0, help="output lengths in new-tokens x [1-S, 1+S]")
    p.add_argument("--waves", type=int, default=2, help="requests per round = waves x concurrency")
    p.add_argument("--max-prompt-len", type=int, default=None, help="keep the first N tokens of each prompt")
    p.add_argument("--time-budget-s", type=float, help="trim measured rounds to fit (>= 1 a concurrency runs)")
    p.add_argument("--parity-bar", type=float, default=0.02, help="min |ratio - 1| for a win/loss (default 2%%)")
    p.add_argument("--no-progress", action="store_true")
    add_device_args(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    setup_logging(args.verbose)
    try:
        arms = parse_arms(args.arms, args.noise_arm, args.spec_noise_arm)
    except ValueError as err:
        raise SystemExit(f"--arms: {err}") from None
    if args.rounds < 1 or args.waves < 1 or min(args.concurrency) < 1:
        raise SystemExit("--rounds, --waves and every --concurrency must be >= 1")
    device = resolve_device(args.device)
    target, drafter, prompt_path = weights_of(args, device, arms)
    prompts = load_prompts(prompt_path, target, args.max_prompt_len)
    try:
        lengths = output_lengths(len(prompts), args.new_tokens, args.length_spread) if args.length_spread else None
    except ValueError as err:
        raise SystemExit(f"--length-spread: {err}") from None
    seq_tokens = max(len(p) for p in prompts) + (max(lengths) if lengths else args.new_tokens)
    max_c = max(args.concurrency)
    engines = engine_pair(target, drafter, args, device, max_num_seqs=max_c, seq_tokens=seq_tokens)
    meta = run_meta("sweep", device, list(argv) if argv is not None else None)
    meta.update(target=str(target), drafter=str(drafter), prompts=str(prompt_path), num_prompts=len(prompts))
    meta.update(length_spread=args.length_spread)
    grid = (engines, arms, prompts, args.concurrency, args.rounds, lengths or args.new_tokens, args.waves)
    rows, trimmed = run_sweep(*grid, args.time_budget_s, progress=not args.no_progress)
    write_outputs(args.out, rows, [a.label for a in arms], meta, trimmed, args.parity_bar)
    return 0


def write_outputs(out: Path, rows: list[dict], arms: list[str], meta: dict, trimmed: dict, bar: float) -> list[dict]:
    summary = summarize(rows, arms, bar)
    write_csv(out / "sweep.csv", rows)
    write_csv(out / "sweep_summary.csv", [{**s, "accept_hist": " ".join(map(str, s["accept_hist"]))} for s in summary])
    table = sweep_markdown(summary, bar) + adaptive_markdown(rows, summary)
    trims = "".join(f"- time budget: c={c} ran {n} rounds\n" for c, n in trimmed.items())
    (out / "sweep.md").write_text(f"# Lever sweep\n\n{meta_lines(meta)}{trims}\n{table}")
    plotted = sweep_plot(summary, arms, out / "sweep.png", meta["command"])
    floors = dict(noise_floors=noise_floors(rows), spec_noise_floors=noise_floors(rows, SPEC_NOISE_ARM, SPEC))
    record = dict(arms=arms, **floors, trimmed_rounds=trimmed, parity_bar=bar, plot=plotted, summary=summary)
    write_json(out / "sweep.json", {**meta, **record})
    print(table)
    print(f"wrote {out}/sweep.csv, sweep_summary.csv, sweep.md, sweep.json" + (", sweep.png" if plotted else ""))
    return summary
