"""GPU micro-benchmark of the Triton kernels at the Qwen3-4B shapes: skinny projections against
cuBLAS, the fused prologues and epilogues against their unfused pairs, the batch-invariant GEMM and
paged attention; writes the tuned table (DIR/tuned/<device>.json; --write-tuned also installs it in
engine/kernels/tuned/). Sections, timing and the table's rules: the benchmarks README, "kernels".

    python -m engine.bench kernels --out DIR [--timer graph|do_bench] [--quick] [--write-tuned]
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

import torch

from engine.bench import kernel_cases as cases
from engine.bench.hw import copy_bandwidth
from engine.bench.kernel_cases import MS
from engine.bench.kernel_report import write_tuned
from engine.bench.kernel_sweeps import bench_fused, bench_linear, bench_norm
from engine.bench.kernel_sweeps_untuned import bench_attention, bench_linear_invariant
from engine.bench.kernel_timing import Timer
from engine.bench.report import write_csv


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine.bench kernels", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="directory for the CSVs and report.md")
    p.add_argument("--timer", choices=["graph", "do_bench"], default="graph")
    p.add_argument("--peak-gbps", type=float, default=4300.0, help="copy bandwidth the fractions refer to")
    p.add_argument("--quick", action="store_true", help="fewer configs (a smoke run)")
    p.add_argument("--ms", type=lambda s: [int(v) for v in s.split(",")], default=MS)
    p.add_argument("--skip", default="", help="comma list of sections to skip: linear,fused,norm,invariant,attention")
    p.add_argument("--budget-s", type=float, default=100.0, help="the extended candidates stop at 55%% of it")
    attn = "paged-attention cases BATCH:CONTEXT:SPAN,... (default: the standard grid)"
    p.add_argument("--attn-cases", type=cases.parse_attn_cases, default=cases.ATTN_CASES, help=attn)
    p.add_argument("--write-tuned", action="store_true", help="install the table in engine/kernels/tuned/")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("python -m engine.bench kernels needs a CUDA device", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    timer, t0 = Timer(args.timer), time.time()
    args.t0, args.state = t0, {}
    skip = set(args.skip.split(","))
    copy = copy_bandwidth(torch.device(cases.DEVICE), 1 << 30) / 1e9
    report = [
        f"# Kernel micro-benchmark: {torch.cuda.get_device_name()}, torch {torch.__version__}, timer={args.timer}\n",
        f"Measured D2D copy bandwidth: {copy:.0f} GB/s (read+write); "
        f"fractions below are of {args.peak_gbps:.0f} GB/s.\n",
    ]
    sections = [
        ("linear", bench_linear, "linear.csv"),
        ("fused", bench_fused, "silu_mul_linear.csv"),
        ("norm", bench_norm, "add_rms_norm_linear.csv"),
        ("invariant", bench_linear_invariant, "linear_invariant.csv"),
        ("attention", bench_attention, "attention.csv"),
    ]
    failed, written = [], False
    for name, fn, csv_name in sections:
        if name in skip:
            continue
        print(f"== {name} ({time.time() - t0:.0f}s)", flush=True)
        try:
            rows, md = fn(args, timer, args.peak_gbps)
        except Exception:  # reported; the other sections (and the tuned table) still run
            traceback.print_exc()
            failed.append(name)
            report.append(f"### {name}: FAILED (see stderr)\n")
            continue
        if rows:
            write_csv(args.out / csv_name, rows)
        report.append(md + "\n")
        if name == "norm":  # before the sections that do not feed it
            write_tuned(args, report, args.write_tuned)
            written = True
    if not written and not {"linear", "fused", "norm"} <= skip:
        write_tuned(args, report, args.write_tuned)
    report.append(f"Total bench time: {time.time() - t0:.0f}s")
    text = "\n".join(report)
    (args.out / "report.md").write_text(text + "\n")
    print("\n" + text)
    if failed:
        print(f"sections failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
