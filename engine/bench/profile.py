"""The cost profile: a target verify forward (runner.verify, a graph replay on the GPU) by rows = batch x
span, a drafter forward by batch, and a prefill by batch (time_prefills), timed as the engine's policy
calibrates (engine/policy/calibration.py).

    python -m engine.bench profile --geometry 4b --out DIR
"""

from __future__ import annotations

import argparse
import logging
import statistics
from collections.abc import Sequence
from pathlib import Path

import torch

from engine.bench.common import add_device_args, drafter_block, make_engine, resolve_device, setup_logging, torch_dtype
from engine.bench.meta import meta_lines, run_meta
from engine.bench.plots import profile_plot
from engine.bench.report import fmt, markdown_table, write_csv, write_json
from engine.fixture.known.geometry import GEOMETRIES, random_pair
from engine.policy.calibration import time_forwards as profile_costs  # the engine's timing (the study's too)
from engine.policy.warmup import dummy_requests
from engine.timing import time_ms

log = logging.getLogger(__name__)


def time_prefills(engine, batches: Sequence[int], prompt_len: int, repeats: int = 3) -> list[dict]:
    """Rows {kind: prefill, batch, span, context, rows, bucket, ms, ms_min, ms_max}: runner.prefill (logits
    at each request's last row only) of `batch` dummy prompts of prompt_len, in groups of the token budget."""
    budget, rows = engine.config.max_num_batched_tokens, []
    with dummy_requests(engine, max(batches), prompt_len, 1) as reqs:
        for b in batches:
            per = max(1, budget // prompt_len)
            groups = [reqs[i : min(i + per, b)] for i in range(0, b, per)]
            samples = time_ms(lambda g=groups: [engine.runner.prefill(x) for x in g], engine.device, repeats)
            row = dict(kind="prefill", batch=b, span=prompt_len, context=prompt_len, rows=b)
            row.update(bucket=engine.runner.graphs.rows(b), ms=statistics.median(samples))
            rows.append(row | dict(ms_min=min(samples), ms_max=max(samples)))
    return rows


def mark_over(rows: list[dict], threshold: float) -> float | None:
    """Mark verify rows slower than threshold x the 1-row (batch 1, span 1) time; returns that time."""
    one = next((r["ms"] for r in rows if r["kind"] == "verify" and r["rows"] == 1), None)
    for r in rows:
        r["x_one_row"] = r["ms"] / one if one and r["kind"] == "verify" else None
        r["over"] = bool(one) and r["kind"] == "verify" and r["ms"] > threshold * one
    return one


def free_rows(rows: Sequence[dict]) -> tuple[int | None, dict | None]:
    """(N, first): every verify point with rows <= N is within the threshold, and `first` is the
    smallest-rows point over it (None when none is)."""
    verify = sorted((r for r in rows if r["kind"] == "verify"), key=lambda r: (r["rows"], r["ms"]))
    first = next((r for r in verify if r["over"]), None)
    within = [r["rows"] for r in verify if first is None or r["rows"] < first["rows"]]
    return (max(within) if within else None), first


def summary_line(rows: Sequence[dict], threshold: float) -> str:
    n, first = free_rows(rows)
    line = f"verify cost within {threshold}x of one row up to {n} rows"
    if first is None:
        return line + " (every measured point)"
    return line + (
        f"; first over: {first['rows']} rows (batch {first['batch']} x span {first['span']}) at "
        f"{first['ms']:.3f} ms = {first['x_one_row']:.2f}x"
    )


def profile_markdown(rows: Sequence[dict], threshold: float) -> str:
    verify = [r for r in rows if r["kind"] == "verify"]
    batches = sorted({r["batch"] for r in verify})
    spans = sorted({r["span"] for r in verify})
    cell = {(r["batch"], r["span"]): r for r in verify}
    table = []
    for b in batches:
        line = [b]
        for s in spans:
            r = cell.get((b, s))
            line.append("—" if r is None else f"{r['ms']:.3f} ({r['x_one_row']:.2f}x){' ▲' if r['over'] else ''}")
        table.append(line)
    text = "Target verify forward, ms (x the 1-row time); ▲ = over the threshold. Rows = batch x span.\n\n"
    text += markdown_table(["batch \\ span", *[str(s) for s in spans]], table) + "\n"
    draft = [r for r in rows if r["kind"] == "draft"]
    if draft:
        text += f"\nDrafter forward (one block per request, {draft[0]['span']} drafts each), ms:\n\n"
        cells = [[r["batch"], fmt(r["ms"], 3), fmt(r["ms_min"], 3), fmt(r["ms_max"], 3)] for r in draft]
        text += markdown_table(["batch", "ms", "min", "max"], cells) + "\n"
    return text + f"\n**{summary_line(rows, threshold)}**\n"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine.bench profile", description=__doc__.split("\n\n")[0])
    geometry = f"{'|'.join(GEOMETRIES)} (random weights) or a target DIR (or a pair DIR with target/, drafter/)"
    p.add_argument("--geometry", default="4b", help=geometry)
    p.add_argument("--drafter", type=Path, help="drafter DIR for --geometry DIR")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    p.add_argument("--spans", type=int, nargs="+", default=[1, 4, 8, 16])
    p.add_argument("--context", type=int, default=256, help="tokens in each request's KV cache")
    p.add_argument("--repeats", type=int, default=5, help="samples per point (the median is reported)")
    p.add_argument("--iters", type=int, default=10, help="back-to-back forwards per sample")
    p.add_argument("--threshold", type=float, default=1.2)
    p.add_argument("--std", type=float, default=0.02, help="random weight std")
    p.add_argument("--time-budget-s", type=float, default=None, help="stop measuring new points after this")
    add_device_args(p)
    return p


def _weights(args: argparse.Namespace, device: torch.device):
    if args.geometry in GEOMETRIES:
        return random_pair(args.geometry, device, torch_dtype(args.dtype, device), args.std)
    root = Path(args.geometry)
    if (root / "target").is_dir():
        return root / "target", args.drafter or ((root / "drafter") if (root / "drafter").is_dir() else None)
    if not root.is_dir():
        raise SystemExit(f"--geometry {args.geometry!r}: not one of {GEOMETRIES} and not a directory")
    return root, args.drafter


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    setup_logging(args.verbose)
    if min(args.batches) < 1 or min(args.spans) < 1 or args.context < 1:
        raise SystemExit("--batches, --spans and --context must be >= 1")
    device = resolve_device(args.device)
    target, drafter = _weights(args, device)
    batches, spans = sorted(set(args.batches) | {1}), sorted(set(args.spans) | {1})  # the 1-row reference
    headroom = 0 if drafter is None else drafter_block(drafter)
    size = dict(max_num_seqs=max(batches), seq_tokens=args.context + max(spans), headroom=headroom)
    engine = make_engine(target, drafter, args, device, **size)
    with dummy_requests(engine, max(batches), args.context, max(spans)) as reqs:
        rows = profile_costs(
            engine.runner, engine.rounds.accept, reqs, batches, spans, args.repeats, args.iters, args.time_budget_s
        )
    mark_over(rows, args.threshold)
    meta = run_meta("profile", device, list(argv) if argv is not None else None)
    meta.update(geometry=args.geometry, context=args.context, threshold=args.threshold)
    meta.update(target=getattr(target, "name", str(target)), drafter=getattr(drafter, "name", str(drafter)))
    write_csv(args.out / "profile.csv", rows)
    table = profile_markdown(rows, args.threshold)
    (args.out / "profile.md").write_text(f"# Cost profile: {args.geometry}\n\n{meta_lines(meta)}\n{table}")
    plotted = profile_plot(rows, args.out / "profile.png", args.threshold, meta["command"])
    n, first = free_rows(rows)
    write_json(args.out / "profile.json", {**meta, "free_rows": n, "first_over": first, "plot": plotted, "rows": rows})
    print(table)
    print(f"wrote {args.out}/profile.csv, profile.md, profile.json" + (", profile.png" if plotted else ""))
    return 0
