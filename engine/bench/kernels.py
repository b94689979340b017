"""GPU micro-benchmark of the Triton kernels (H200-sized; run on a CUDA host).

    python -m engine.bench.kernels --out DIR [--timer graph|do_bench] [--quick] [--write-tuned]

1. Skinny-M linear: the Qwen3-4B projection shapes at M = 1..128 over a config sweep, against
   F.linear (cuBLAS). Prints GB/s (weight bytes / time) and the fraction of the copy bandwidth, the
   best config per (shape, M), the crossover M where cuBLAS wins. q|k|v, o and down (the shapes
   furthest from the copy bandwidth) get an extended sweep (more BLOCK_N/BLOCK_K/split-K/stages/warps
   points), cut short once `--budget-s` is mostly spent.
2. Fused SwiGLU + down (`silu_mul_linear`) at M = 1..16: the best linear configs of the down shape
   and a few wider-N tiles, against silu_and_mul + the best of cuBLAS / the skinny kernel.
3. Residual add + RMSNorm in the projection's prologue (`add_rms_norm_linear`) for q|k|v and
   gate|up at M = 1..16: the shape's best linear configs against add_rms_norm + the best of cuBLAS
   / the skinny kernel.
4. The batch-invariant GEMM (fixed tiles for every M) at a few tilings.
5. Paged attention: decode at batch 1/8/64 x context 256/2048 (auto split vs forced splits vs the
   batch-invariant config) and verify spans of 8.
CSVs land in DIR (linear.csv, silu_mul_linear.csv, add_rms_norm_linear.csv, linear_invariant.csv,
attention.csv) with the printed Markdown (report.md) and the tuned table from this run
(DIR/tuned/<device>.json, always).
`--write-tuned` also installs that table as engine/kernels/tuned/<device>.json, where the kernels read
it (engine/kernels/tuning.py): merged over the existing file, every measured (shape, M bucket) set
to its fastest config that passed the correctness check and beat cuBLAS (or the unfused pair), or
removed (cuBLAS / unfused serves it). The table is written after section 3, before the others run.

Timing (CUDA-graph replay over rotated weight / KV copies, or `--timer do_bench`): kernel_timing.py.

Modules: kernel_cases.py (shapes, candidates), kernel_timing.py (timer, correctness gate),
kernel_sweeps.py and kernel_sweeps_untuned.py (the sections), kernel_report.py (the tuned table);
report.py writes the CSVs and tables; this one is the CLI.
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
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="directory for the CSVs and report.md")
    p.add_argument("--timer", choices=["graph", "do_bench"], default="graph")
    p.add_argument("--peak-gbps", type=float, default=4300.0, help="copy bandwidth the fractions refer to")
    p.add_argument("--quick", action="store_true", help="fewer configs (a smoke run)")
    p.add_argument("--ms", type=lambda s: [int(v) for v in s.split(",")], default=MS)
    p.add_argument("--skip", default="", help="comma list of sections to skip: linear,fused,norm,invariant,attention")
    p.add_argument(
        "--budget-s",
        type=float,
        default=100.0,
        help="wall-time target: the extended linear candidates stop at 55%% of it",
    )
    p.add_argument(
        "--write-tuned",
        action="store_true",
        help="install this run's tuned table as engine/kernels/tuned/<device>.json (it always goes to DIR/tuned/)",
    )
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("engine.bench.kernels needs a CUDA device", file=sys.stderr)
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
