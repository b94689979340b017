"""The lever study on the Qwen3-4B geometry: the known-continuation target and the modelled drafter
(real forwards, modelled first wrong draft), one device run end to end.

    python -m engine.bench study --out DIR --profiles code chat code+chat spread --time-budget-s 300
"""

from __future__ import annotations

import argparse
import gc
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from engine.bench.arms import ADAPTIVE_ARM, Arm, arm_drafts, parse_arms
from engine.bench.common import (
    add_device_args,
    engine_pair,
    make_engine,
    memory_budget,
    pool_block_bytes,
    resolve_device,
    setup_logging,
    torch_dtype,
    weight_bytes,
)
from engine.bench.meta import run_meta
from engine.bench.profile import profile_costs, time_prefills
from engine.bench.report import write_csv, write_json
from engine.bench.study.contexts import ContextRun, fit_grid, write_contexts
from engine.bench.study.draws import draws_stage
from engine.bench.study.graphs import CaptureLog, graph_stage, tag_rows
from engine.bench.study.report import predicted_seconds, write_study
from engine.bench.study.step_walls import (
    add_calibration_args,
    budget_tokens,
    calib_batches,
    calibration_stage,
    centred_warmup,
    table_context,
)
from engine.bench.sweep import run_sweep
from engine.config import SamplingParams
from engine.engine import Engine
from engine.fixture.known.geometry import random_pair, random_prompts
from engine.fixture.known.modelled import PROFILE_HELP, ModelledDrafter, parse_profile
from engine.fixture.known.target import echo_failures, known_pair
from engine.kernels.span_meta import ragged_spans
from engine.models.config import DFlashConfig
from engine.policy.costs import CostTable
from engine.policy.span import policy_spans
from engine.policy.warmup import dummy_requests

log = logging.getLogger(__name__)

ARMS = [
    *("plain", "spec", "spec+trim=2", "spec+trim=4", "spec+trim=8", "spec+gate=32", "spec+gate=64", "spec+gate=128"),
    ADAPTIVE_ARM,
]
CONCURRENCY = [1, 2, 4, 8, 16, 32, 64, 128, 256]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine.bench study", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--geometry", default="4b", help="4b (the study) or a fixture recipe's shapes: tiny, small")
    p.add_argument("--profiles", nargs="+", default=["code", "chat"], help=PROFILE_HELP)
    p.add_argument("--concurrency", type=int, nargs="+", default=CONCURRENCY)
    p.add_argument("--arms", nargs="+", default=ARMS, help="plain#2 and spec#2 are always added")
    p.add_argument("--rounds", type=int, default=3, help="measured rounds per (c, profile), + 1 warm-up")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=16, help="random prompts of this many tokens")
    p.add_argument("--prompt-lens", type=int, nargs="+", help="a study per prompt length (files under prompt-N/)")
    p.add_argument("--echo-steps", type=int, default=256, help="greedy steps of the echo check")
    p.add_argument("--echo-batch", type=int, default=64)
    p.add_argument("--profile-budget-s", type=float, default=120.0, help="the cost profile's share")
    p.add_argument("--time-budget-s", type=float, help="the study's wall: the sweep gets what the stages leave")
    p.add_argument("--reserve-s", type=float, default=30.0, help="kept back from the sweep for the report")
    p.add_argument("--graphs-budget-s", type=float, default=60.0, help="capturing the sweep's graphs before it")
    add_calibration_args(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--parity-bar", type=float, default=0.02)
    add_device_args(p)
    return p


def waves_for(c: int) -> int:
    """Two waves at small c (more prompts per round where a round is cheap), one above."""
    return 2 if c <= 16 else 1


def arms_at(arms: Sequence[Arm], c: int) -> list[Arm]:
    """A gate over the concurrency never trips: that arm is spec itself, measured by spec and spec#2."""
    return [a for a in arms if not a.gate or a.gate <= c]


def measure_costs(
    engine: Engine, batches: list[int], spans: list[int], context: int, budget_s: float, required=(1,)
) -> list[dict]:
    """Profile rows (graph replays at `context` tokens a request) on an idle engine, left idle; the
    `required` spans at every batch whatever the budget."""
    with dummy_requests(engine, max(batches), context, max(spans) + 1) as reqs:
        args = (engine.runner, engine.rounds.accept, reqs, batches, spans, 3, 3, budget_s)
        return profile_costs(*args, required=required)


def _profile_csv(spec: list[dict], plain: list[dict], random: list[dict], prefill: list[dict]) -> list[dict]:
    named = [("known+drafter", spec), ("known plain", plain), ("random plain", random), ("prefill", prefill)]
    return [{"engine": name, **r} for name, rows in named for r in rows]


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def echo_check(engine: Engine, prompts: list[list[int]], steps: int) -> dict:
    """Plain greedy decode of the prompts: every output token must be its prompt's last token."""
    outs = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True))
    bad = echo_failures(prompts, [o.token_ids for o in outs])
    return {"prompts": len(prompts), "steps": steps, "failures": bad}


def lossless_check(engine: Engine, arms: Sequence[Arm], prompts: list[list[int]], steps: int) -> list[dict]:
    """Every speculative arm's greedy outputs against the known continuation (= plain greedy, which
    the echo check proves): a mismatch is an engine bug."""
    rows = []
    for arm in arms:
        if arm.is_plain or "#" in arm.label:
            continue
        engine.set_levers(**arm.levers())
        before = engine.stats.committed_tokens
        outs = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True))
        bad = echo_failures(prompts, [o.token_ids for o in outs])
        row = dict(arm=arm.label, requests=len(prompts), compared_tokens=sum(len(o.token_ids) for o in outs))
        rows.append(row | dict(round_tokens=engine.stats.committed_tokens - before, mismatches=len(bad), first=bad[:3]))
    engine.set_levers(max_batch=0, max_drafts=0, policy="static")
    return rows


def sweep_all(engines: dict, drafter: ModelledDrafter, profiles, arms, prompts, args, costs) -> list[dict]:
    """run_sweep per concurrency and profile over the arms that differ there, the budget split by the
    cost model's predicted round time (every c gets its warm-up and >= 1 round)."""
    buckets = graph_buckets(engines["spec"])
    weights = {}
    for c in args.concurrency:
        weights[c] = predicted_seconds(costs, c, arms_at(arms, c), profiles, args, waves_for(c), buckets)
    start, rows = time.perf_counter(), []
    for i, c in enumerate(args.concurrency):
        for profile in profiles:
            drafter.set_profile(profile)
            budget = None
            if args.time_budget_s is not None:
                left = args.sweep_budget_s - (time.perf_counter() - start)
                later = sum(weights[x] for x in args.concurrency[i:])
                budget = max(0.0, left * weights[c] / later / len(profiles))
                least = weights[c] / len(profiles) * 2 / (args.rounds + 1)  # warm-up + one round, predicted
                if budget < least:
                    log.warning("time budget: c=%d %s skipped (%.0f s left, %.0f needed)", c, profile.name, left, least)
                    continue
            captures = CaptureLog(engines, drafter.before_arm)
            sweep = (engines, arms_at(arms, c), prompts, [c], args.rounds, args.new_tokens, waves_for(c), budget)
            got, _ = run_sweep(*sweep, progress=False, before_arm=captures.before_arm)
            tag_rows(got, captures.runs(), len(arms_at(arms, c)))
            rows += [{"profile": profile.name, **r} for r in got]
            write_csv(args.out / "sweep.csv", rows)  # a run cut short keeps what it measured
            log.info("c=%d %s: %d rows, %.0f s so far", c, profile.name, len(got), time.perf_counter() - start)
    return rows


def study_prompts(args: argparse.Namespace, vocab: int) -> list[list[int]]:
    """The sweep's prompts (seeded: a report from the files rebuilds them)."""
    count = 4 * max(args.concurrency) * max(args.rounds + 1, 4)
    return random_prompts(count, args.prompt_len, vocab, args.seed + 1)


def study_spans(arms: Sequence[Arm], per_round: int, needed: bool = False) -> list[int]:
    """The verify spans the cost profile times: 1 and every 1 + K an arm verifies, the adaptive policy's and
    policy=budget's ragged spans (its rows); never a prompt-long span (a prefill is timed as one:
    time_prefills, one logits row a request). needed: those timed whatever the budget (the arms' own)."""
    spans = {1} | {1 + arm_drafts(a, per_round) for a in arms if not a.is_plain}
    spans |= set(ragged_spans(per_round)) if any(a.per_request for a in arms) else set()
    return sorted(spans | set(policy_spans(per_round)) if any(a.adaptive for a in arms) and not needed else spans)


def seq_tokens_at(args: argparse.Namespace, prompt_len: int, max_span: int, per_round: int) -> int:
    """Tokens a request of the study at `prompt_len` reaches: the prompt and the most of its new tokens,
    the echo check's steps, the profile's rows past the table context and the calibration's steps."""
    context = prompt_len + args.new_tokens // 2  # table_context
    plain_lead = centred_warmup(context, prompt_len, args.calib_steps, 2)
    calib = max(budget_tokens(args.calib_steps + 2, per_round), budget_tokens(plain_lead + args.calib_steps, 0))
    return prompt_len + max(args.new_tokens, args.echo_steps, context - prompt_len + max_span + 1, calib)


def graph_buckets(engine: Engine) -> list[int]:
    """The batch buckets a step's graphs run at (none when the engine runs eagerly)."""
    graphs = engine.runner.graphs
    return list(graphs.buckets) if graphs.enabled else []


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    setup_logging(args.verbose)
    args.prompt_lens = args.prompt_lens or [args.prompt_len]
    if args.rounds < 1 or min(args.concurrency) < 1 or args.new_tokens < 2 or min(args.prompt_lens) < 1:
        raise SystemExit("--rounds, --concurrency and --prompt-lens must be >= 1 and --new-tokens >= 2")
    if not args.graphs_budget_s >= 0:  # NaN too
        raise SystemExit(f"--graphs-budget-s must be >= 0 (0: no graph stage), got {args.graphs_budget_s}")
    try:
        profiles = [parse_profile(p) for p in args.profiles]
        arms = parse_arms(args.arms, noise_arm=True, spec_noise_arm=True)
        args.calib_batches = calib_batches(args)
    except ValueError as err:
        raise SystemExit(str(err)) from None
    device = resolve_device(args.device)
    dtype = torch_dtype(args.dtype, device)
    argv = list(argv) if argv is not None else sys.argv[1:]
    t0 = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    target, drafter_ckpt = known_pair(args.geometry, device, dtype, args.seed)
    per_round = DFlashConfig.from_dict(drafter_ckpt.config).drafts_per_round
    profiles = [p.first(per_round) for p in profiles]
    spans = study_spans(arms, per_round)
    seqs = {n: seq_tokens_at(args, n, max(spans), per_round) for n in args.prompt_lens}
    budget = memory_budget(device, args.gpu_memory_utilization)
    later = weight_bytes([target, target, drafter_ckpt], dtype, device)  # the random target's, then the pair's
    per_block = pool_block_bytes(target, drafter_ckpt, dtype)
    pool = fit_grid(args.concurrency, seqs, per_round + 1, per_block, budget, later)
    cs = sorted(set(args.concurrency))
    contexts = [ContextRun(args, n, cs, argv, len(args.prompt_lens) > 1) for n in args.prompt_lens]
    size = dict(max_num_seqs=cs[-1], seq_tokens=max(seqs.values()), blocks=pool)
    random_target, _ = random_pair(args.geometry, device, dtype, seed=args.seed)
    random_engine = make_engine(random_target, None, args, device, **size)
    for run in contexts:  # the equality check's random weights: built, profiled at every context, freed
        run.equality = measure_costs(random_engine, run.batches, [1], run.context, args.profile_budget_s / 3)
    del random_target, random_engine
    _free(device)
    engines = engine_pair(target, drafter_ckpt, args, device, **size, grid=f"{args.prompt_lens} prompt tokens x c={cs}")
    drafter = ModelledDrafter(engines["spec"], profiles[0], seed=args.seed).install()
    summaries = {}
    for i, run in enumerate(contexts):
        if args.time_budget_s is not None:
            left = args.time_budget_s - (time.perf_counter() - t0)
            run.args.time_budget_s = max(0.0, left / (len(contexts) - i))
        summaries[run.context] = study_context(run, engines, drafter, profiles, arms, spans, per_round)
        log.info("prompt length %d done at %.0f s", run.context, time.perf_counter() - t0)
    if len(contexts) > 1:
        write_contexts(args.out, run_meta("study", device, argv), summaries, cs)
    return 0


def study_context(run, engines: dict, drafter: ModelledDrafter, profiles, arms, spans, per_round: int) -> list[dict]:
    """Every stage of the study at one prompt length on the shared engines, its files under run.args.out:
    the summary rows."""
    args, t0 = run.args, time.perf_counter()
    meta = run_meta("study", engines["spec"].device, run.argv)
    context, batches = table_context(args), run.batches
    plain_rows = measure_costs(engines["plain"], batches, [1], context, args.profile_budget_s / 3)
    needed = study_spans(arms, per_round, needed=True)
    profile_rows = measure_costs(engines["spec"], batches, spans, context, args.profile_budget_s, needed)
    prefill_rows = time_prefills(engines["spec"], args.calib_batches, args.prompt_len)
    table = CostTable.from_rows(profile_rows, plain_rows)
    engines["spec"].set_cost_table(table)  # the adaptive arm decides on the costs this run measured
    meta.update(profiles={p.name: p.record() for p in profiles}, argv=run.argv)
    write_json(args.out / "meta.json", {**meta, "buckets": graph_buckets(engines["spec"])})
    profiled = {"spec": profile_rows, "plain": plain_rows, "random": run.equality}
    write_csv(args.out / "profile.csv", _profile_csv(profile_rows, plain_rows, run.equality, prefill_rows))
    prompts = study_prompts(args, engines["plain"].target_cfg.geometry.vocab_size)
    max_c = max(args.concurrency)
    echo = echo_check(engines["plain"], prompts[: min(args.echo_batch, max_c)], args.echo_steps)
    drafter.set_profile(profiles[0])
    lossless = lossless_check(engines["spec"], arms, prompts[: min(64, max_c)], args.new_tokens)
    write_json(args.out / "checks.json", {"echo": echo, "lossless": lossless})
    log.info("echo ok %s, lossless mismatches %s", not echo["failures"], [r["mismatches"] for r in lossless])
    costs = calibration_stage(engines, table, prompts, args, arms, per_round, prefill_rows)
    buckets = [b for b in graph_buckets(engines["spec"]) if b <= max_c]
    graphs = graph_stage(engines["spec"], arms, per_round, buckets, context, args.graphs_budget_s)
    draws = draws_stage(drafter, prompts, profiles, arms, args, waves_for)
    if args.time_budget_s is not None:
        args.sweep_budget_s = max(0.0, args.time_budget_s - (time.perf_counter() - t0) - args.reserve_s)
        log.info("prompt length %d: sweep budget %.0f s", args.prompt_len, args.sweep_budget_s)
    rows = sweep_all(engines, drafter, profiles, arms, prompts, args, costs)
    meta.update(geometry=args.geometry, target="known-" + args.geometry, drafter=f"random-{args.geometry}-dflash")
    meta.update(new_tokens=args.new_tokens, prompt_len=args.prompt_len, graphs_captured=graphs)
    meta["seconds"] = time.perf_counter() - t0
    buckets = graph_buckets(engines["spec"])
    return write_study(args, meta, profiles, arms, rows, profiled, echo, lossless, costs, waves_for, buckets, draws)
