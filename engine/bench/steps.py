"""Where a step's time goes: torch.profiler over closed-loop engine steps, per lever arm.

    python -m engine.bench steps --recipe small --out DIR --concurrency 1 --new-tokens 64 \
        --arms plain spec spec+gate=1
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path

from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from engine.bench.arms import parse_arms
from engine.bench.closed_loop import closed_loop
from engine.bench.common import (
    add_device_args,
    add_weight_args,
    engine_pair,
    load_prompts,
    resolve_device,
    setup_logging,
    weights_of,
)
from engine.bench.meta import meta_lines, run_meta
from engine.bench.report import fmt, markdown_table, write_csv, write_json
from engine.bench.sweep import engine_for
from engine.engine import Engine


def profile_arm(engine: Engine, prompts: Sequence[Sequence[int]], c: int, new_tokens: int, top: int) -> dict:
    """Profile one closed-loop pass of c requests; returns the per-step figures and the top ops."""
    closed_loop(engine, prompts, c, c, new_tokens)  # warm-up: graphs, autotune, allocator
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if engine.device.type == "cuda" else [])
    first = len(engine.timer.records)
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        res = closed_loop(engine, prompts, c, c, new_tokens)
    wall_ms = (time.perf_counter() - t0) * 1e3
    steps = max(1, len(engine.timer.records) - first)
    events = prof.key_averages()
    on_device = (e for e in events if e.device_type == DeviceType.CUDA and e.self_device_time_total > 0)
    kernels = sorted(on_device, key=lambda e: e.self_device_time_total, reverse=True)
    on_host = (e for e in events if e.device_type == DeviceType.CPU)
    host = sorted(on_host, key=lambda e: e.self_cpu_time_total, reverse=True)
    busy_ms = sum(e.self_device_time_total for e in kernels) / 1e3
    out = dict(steps=steps, tok_s=res.tok_s, wall_ms_per_step=wall_ms / steps, busy_ms_per_step=busy_ms / steps)
    out.update(device_idle=(1 - busy_ms / wall_ms) if kernels else None, tokens_per_step=res.output_tokens / steps)
    out["kernels"] = [_op(e.key, e.count, e.self_device_time_total, steps) for e in kernels[:top]]
    return out | dict(host=[_op(e.key, e.count, e.self_cpu_time_total, steps) for e in host[:top]])


def _op(name: str, count: int, total_us: float, steps: int) -> dict:
    return {"name": name[:90], "calls_per_step": count / steps, "ms_per_step": total_us / 1e3 / steps}


def steps_markdown(results: dict[str, dict]) -> str:
    head = ["arm", "steps", "tok/s", "tokens/step", "wall ms/step", "device-busy ms/step", "device idle"]
    rows = [
        [arm, r["steps"], fmt(r["tok_s"], 0), fmt(r["tokens_per_step"], 2), fmt(r["wall_ms_per_step"], 3)]
        + [fmt(r["busy_ms_per_step"], 3), "-" if r["device_idle"] is None else f"{100 * r['device_idle']:.0f} %"]
        for arm, r in results.items()
    ]
    parts = [markdown_table(head, rows)]
    for arm, r in results.items():
        for kind, label in (("kernels", "device kernels"), ("host", "host ops (self CPU time)")):
            if r[kind]:
                ops = [[o["name"], fmt(o["calls_per_step"], 1), fmt(o["ms_per_step"], 4)] for o in r[kind]]
                parts.append(f"### {arm}: top {label}\n\n" + markdown_table(["op", "calls/step", "ms/step"], ops))
    return "\n\n".join(parts) + "\n"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine.bench steps", description=__doc__.split("\n\n")[0])
    add_weight_args(p)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--arms", nargs="+", default=["plain", "spec"], help="lever arms, as in the sweep")
    p.add_argument("--top", type=int, default=15, help="ops listed per arm")
    add_device_args(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    setup_logging(args.verbose)
    if args.concurrency < 1 or args.new_tokens < 1:
        raise SystemExit("--concurrency and --new-tokens must be >= 1")
    try:
        arms = parse_arms(args.arms)
    except ValueError as err:
        raise SystemExit(f"--arms: {err}") from None
    device = resolve_device(args.device)
    target, drafter, prompt_path = weights_of(args, device, arms)
    prompts = load_prompts(prompt_path, target)
    seq_tokens = max(len(p) for p in prompts) + args.new_tokens
    engines = engine_pair(target, drafter, args, device, max_num_seqs=args.concurrency, seq_tokens=seq_tokens)
    results = {
        arm.label: profile_arm(engine_for(arm, engines), prompts, args.concurrency, args.new_tokens, args.top)
        for arm in arms
    }
    meta = run_meta("steps", device, list(argv) if argv is not None else None)
    meta.update(target=str(target), drafter=str(drafter), concurrency=args.concurrency, new_tokens=args.new_tokens)
    ops = [{"arm": a, "kind": k, **o} for a, r in results.items() for k in ("kernels", "host") for o in r[k]]
    write_csv(args.out / "steps.csv", ops)
    table = steps_markdown(results)
    (args.out / "steps.md").write_text(f"# Where a step's time goes\n\n{meta_lines(meta)}\n{table}")
    write_json(args.out / "steps.json", {**meta, "results": results})
    print(table)
    return 0
