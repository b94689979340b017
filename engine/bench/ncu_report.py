"""One table from the `ncu` stage's Nsight Compute text reports (DIR/<op>-<rows>.txt, as
scripts/device.sh writes them): per profiled kernel its duration, DRAM throughput, occupancy, issue
rate and the stall the report names first, so the per-kernel limits read side by side.

    python -m engine.bench.ncu_report DIR

Writes DIR/ncu.csv and DIR/ncu.md and prints the Markdown. Durations are of one launch with the
caches flushed and no PDL overlap (ncu serialises kernels): compare kernels, not the decode step.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from pathlib import Path

from engine.bench.report import markdown_table, write_csv

HEADER = re.compile(r"^  (\S+) \((\d+), (\d+), (\d+)\)x\((\d+), \d+, \d+\), Context")
UNITS = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "Mbyte/s": 1e-6, "Gbyte/s": 1e-3, "Tbyte/s": 1.0}
METRICS = {  # report line -> column, and whether its unit is scaled (to us, or TB/s)
    "Duration": ("us", True),
    "DRAM Throughput": ("dram_pct", False),
    "Memory Throughput": ("mem_tb_s", True),
    "L2 Hit Rate": ("l2_hit_pct", False),
    "Registers Per Thread": ("regs", False),
    "Achieved Occupancy": ("achieved_occ_pct", False),
    "Theoretical Occupancy": ("theoretical_occ_pct", False),
    "Issued Warp Per Scheduler": ("issue_per_cycle", False),
    "Warp Cycles Per Issued Instruction": ("cycles_per_issue", False),
}
STALL = re.compile(r"each warp of this workload spends ([\d.]+) cycles being stalled (.*?)\. This stall type")


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def parse(text: str) -> list[dict]:
    """The kernels of one report, in launch order."""
    kernels: list[dict] = []
    for line in text.splitlines():
        head = HEADER.match(line)
        if head:
            grid = int(head[2]) * int(head[3]) * int(head[4])
            kernels.append({"kernel": head[1], "grid": grid, "block": int(head[5]), "_text": []})
            continue
        if not kernels:
            continue
        k = kernels[-1]
        k["_text"].append(line.strip())
        parts = line.split()
        for name, (column, scaled) in METRICS.items():
            if line.strip().startswith(name + " ") and column not in k and len(parts) >= 2:
                unit = parts[-2] if scaled else None
                if scaled and unit not in UNITS:
                    continue  # e.g. "Memory Throughput %" of the speed-of-light section
                k[column] = round(_number(parts[-1]) * (UNITS[unit] if scaled else 1.0), 3)
    for k in kernels:
        stall = STALL.search(" ".join(k.pop("_text")))
        k["top_stall"] = f"{stall[1]} cycles {stall[2].split('. ')[0]}" if stall else ""
    return kernels


def collect(directory: Path) -> list[dict]:
    rows = []
    for path in sorted(directory.glob("*-*.txt")):
        op, _, rows_text = path.stem.rpartition("-")
        if not rows_text.isdigit():
            continue
        rows += [{"op": op, "rows": int(rows_text), **k} for k in parse(path.read_text())]
    return rows


def markdown(rows: Sequence[dict]) -> str:
    columns = ["op", "rows", "kernel", "grid", "us", "dram_pct", "mem_tb_s", "achieved_occ_pct", "issue_per_cycle"]
    table = [[r.get(c, "") for c in columns] + [r["top_stall"]] for r in rows]
    header = ["op", "rows", "kernel", "grid", "µs", "DRAM %", "TB/s", "occupancy %", "issued/cycle", "top stall"]
    return markdown_table(header, table)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine.bench.ncu_report", description=__doc__.split("\n\n")[0])
    p.add_argument("directory", type=Path)
    args = p.parse_args(argv)
    rows = collect(args.directory)
    if not rows:
        raise SystemExit(f"no Nsight Compute reports (<op>-<rows>.txt) in {args.directory}")
    write_csv(args.directory / "ncu.csv", rows)
    text = markdown(rows)
    (args.directory / "ncu.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
