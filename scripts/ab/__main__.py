"""Compare two builds of pegaspec on one bench command: paired runs in interleaved subprocesses.

    python -m scripts.ab --base REV|DIR --head REV|DIR --out DIR [--repeats 6] [--warmup 1]
        [--metric wall | FILE:COLUMN [--key COLUMN ...]] -- python -m engine.bench decode --out {out} ...

A build is a commit (checked out into a temporary git worktree, removed at the end) or a checkout
directory. Each run is the command with `{out}` replaced by its own directory (DIR/runs/BUILD-PAIR),
run at the build's root with the build first on PYTHONPATH. The metric is the run's wall seconds or
COLUMN of the CSV FILE the run wrote under {out}, one value per --key row. Writes DIR/ab.csv (each
run's values), DIR/ab.md and DIR/ab.json (per row: medians, head / base and its min … max over the
pairs) and each run's log under DIR/runs/. --base X --head X measures the noise.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

from engine.bench.report import write_csv, write_json
from scripts.ab.builds import Build, checked_out
from scripts.ab.pairs import Metric, markdown, schedule, summarize

log = logging.getLogger("scripts.ab")
REPO = Path(__file__).resolve().parents[2]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m scripts.ab", description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, help="the build the ratio divides by: a commit or a checkout directory")
    p.add_argument("--head", required=True, help="the build measured against it")
    p.add_argument("--out", type=Path, required=True, help="directory for ab.md, ab.csv, ab.json and runs/")
    p.add_argument("--repeats", type=int, default=6, help="pairs of runs (default 6)")
    p.add_argument("--warmup", type=int, default=0, help="untimed runs of each build first (compiles, caches)")
    p.add_argument("--metric", default="wall", help="wall (the run's seconds) or FILE:COLUMN of a CSV under {out}")
    p.add_argument("--key", nargs="+", default=[], help="the CSV columns that name one row (e.g. concurrency)")
    p.add_argument("--repo", type=Path, default=REPO, help="the git repository commits are taken from")
    return p


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str], Metric]:
    """(options, the bench command, its metric); a usage error for a bad value."""
    argv = list(argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    p = _parser()
    args, command = p.parse_args(argv[:cut]), argv[cut + 1 :]
    if not command:
        p.error("give the bench command after --, e.g. -- python -m engine.bench decode --out {out}")
    if args.repeats < 1 or args.warmup < 0:
        p.error(f"--repeats {args.repeats} must be >= 1 and --warmup {args.warmup} >= 0")
    try:
        metric = Metric.parse(args.metric, args.key)
    except ValueError as err:
        p.error(str(err))
    if metric.file is not None and not any("{out}" in a for a in command):
        p.error(f"--metric {args.metric} reads a file under {{out}}: the command must write there (take {{out}})")
    return args, command, metric


def run_once(build: Build, command: Sequence[str], out: Path) -> float:
    """Run the command on build with its output under out; its wall seconds (a failure exits)."""
    out.mkdir(parents=True)
    argv = [a.replace("{out}", str(out)) for a in command]
    logfile = out.with_suffix(".log")
    t0 = time.perf_counter()
    with logfile.open("w") as f:
        rc = subprocess.run(argv, cwd=build.root, env=build.env(dict(os.environ)), stdout=f, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - t0
    if rc.returncode:
        raise SystemExit(f"{build.name} ({build.label}) exited {rc.returncode}: see {logfile}")
    return wall


def compare(
    builds: dict[str, Build], command: Sequence[str], metric: Metric, args: argparse.Namespace
) -> tuple[list[dict], dict]:
    """The warm-ups, then the pairs in schedule order: one row per run and key."""
    runs = args.out / "runs"
    for i in range(args.warmup):
        for name in builds:
            run_once(builds[name], command, runs / f"{name}-warmup{i}")
    rows, values = [], {}
    for seq, (pair, name) in enumerate(schedule(args.repeats)):
        out = runs / f"{name}-{pair}"
        wall = run_once(builds[name], command, out)
        try:
            values[pair, name] = metric.read(out, wall)
        except ValueError as err:
            raise SystemExit(f"{name} pair {pair}: {err}") from None
        got = values[pair, name]
        rows += [dict(seq=seq, pair=pair, build=name, key=k, value=v, wall_s=wall) for k, v in got.items()]
        log.info("pair %d %s: %.1f s", pair, name, wall)
    return rows, values


def main(argv: Sequence[str] | None = None) -> int:
    args, command, metric = parse(sys.argv[1:] if argv is None else argv)
    args.out = args.out.resolve()  # the runs' working directory is their build's root
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if (args.out / "runs").exists():
        raise SystemExit(f"{args.out}/runs exists: give a fresh --out")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pegaspec-ab-") as scratch, ExitStack() as stack:
        base = stack.enter_context(checked_out("base", args.base, args.repo, Path(scratch)))
        head = stack.enter_context(checked_out("head", args.head, args.repo, Path(scratch)))
        rows, values = compare({"base": base, "head": head}, command, metric, args)
    summary = summarize(values)
    meta = {
        "command": shlex.join(command),
        "base": base.label,
        "head": head.label,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "metric": args.metric,
        "keys": args.key,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    table = markdown(summary, metric)
    lines = "".join(f"- {k}: `{meta[k]}`\n" for k in ("command", "base", "head", "metric", "repeats", "date"))
    (args.out / "ab.md").write_text(f"# A/B: head / base\n\n{lines}\n{table}\n")
    write_csv(args.out / "ab.csv", rows)
    write_json(args.out / "ab.json", {**meta, "summary": summary})
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
