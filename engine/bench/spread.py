"""The spread of a fixture recipe over builds: τ from each build's manifest (the reference loop's
eval) beside the c=1 speculative/plain ratio its sweep measured, and whether two builds of one seed
produced the same weights.

    python -m engine.bench spread --builds /tmp/small-s0=/out/sweep-s0 /tmp/small-s1=/out/sweep-s1 --out DIR
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
from collections.abc import Sequence
from pathlib import Path

from engine.bench.report import fmt, markdown_table, read_csv, write_csv

log = logging.getLogger(__name__)


def _sweep_ratio(sweep: Path, arm: str) -> tuple[float, float, float]:
    """(median paired ratio vs plain, the spec#2 noise floor, tokens per round) of `arm` at c=1."""
    rows = {r["arm"]: r for r in read_csv(sweep / "sweep_summary.csv") if r["concurrency"] == "1"}
    if arm not in rows:
        raise ValueError(f"{sweep}: no c=1 row for arm {arm!r} (arms {sorted(rows)})")
    noise = rows.get("spec#2", rows[arm])["noise_floor"]
    return float(rows[arm]["ratio_median"]), float(noise), float(rows[arm]["tokens_per_round"] or "nan")


def build_row(pair: Path, sweep: Path | None, arm: str) -> dict:
    m = json.loads((pair / "manifest.json").read_text())
    row = dict(pair=str(pair), seed=m["seed"], tau=m["eval"]["tau"], ngram_tau=m["eval"]["ngram_tau"])
    row.update(target_heldout_loss=m["target_heldout_loss"], build_s=m["build_seconds"]["total"])
    row["weights"] = ",".join(f"{k}:{v[:12]}" for k, v in sorted(m.get("weights_sha256", {}).items()))
    if sweep is not None:
        ratio, noise, tau_load = _sweep_ratio(sweep, arm)
        row.update(c1_ratio=ratio, c1_noise=noise, tau_under_load=tau_load)
    return row


def summarize(rows: Sequence[dict]) -> list[dict]:
    """Median, min and max over the builds that ran a sweep (one per seed), and per seed built more
    than once whether every build's weights hash the same."""
    swept = [r for r in rows if "c1_ratio" in r]
    out = []
    for key in ("tau", "c1_ratio", "tau_under_load", "target_heldout_loss"):
        xs = [float(r[key]) for r in (swept if key != "tau" else rows) if key in r]
        if xs:
            out.append({"figure": key, "n": len(xs), "median": statistics.median(xs), "min": min(xs), "max": max(xs)})
    for seed in sorted({r["seed"] for r in rows}):
        same = {r["weights"] for r in rows if r["seed"] == seed}
        n = sum(r["seed"] == seed for r in rows)
        if n > 1:
            out.append(
                {"figure": f"seed {seed}: builds with identical weights", "n": n, "median": float(len(same) == 1)}
            )
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine.bench spread", description=__doc__.split("\n\n")[0])
    p.add_argument("--builds", nargs="+", required=True, help="PAIR_DIR[=SWEEP_DIR] per build")
    p.add_argument("--arm", default="spec", help="the sweep arm whose c=1 ratio is reported")
    p.add_argument("--out", type=Path, required=True)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    rows = []
    for spec in args.builds:
        pair, _, sweep = spec.partition("=")
        try:
            rows.append(build_row(Path(pair), Path(sweep) if sweep else None, args.arm))
        except (OSError, KeyError, ValueError) as err:
            log.warning("build %s left out: %s: %s", spec, type(err).__name__, err)
    if not rows:
        raise SystemExit("no build could be read")
    summary = summarize(rows)
    write_csv(args.out / "spread.csv", rows)
    write_csv(args.out / "spread_summary.csv", summary)
    cols = ["figure", "n", "median", "min", "max"]
    table = markdown_table(cols, [[fmt(s.get(c), 3) for c in cols] for s in summary])
    (args.out / "spread.md").write_text(table + "\n")
    log.info("%s", table)
    return 0
