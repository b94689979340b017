"""The cost model's host and prefill terms refit (least squares: a replay is linear in them) to a
finished study's own walls, and the cells the refit model gets within the bar. In-sample: where it
meets the bar and the calibrated prediction does not, the calibration is off, not the model.

    python -m engine.bench study-refit DIR   (a study's output: profile.csv, sweep.csv, summary.csv)
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from engine.bench.arms import arm_drafts, parse_arm
from engine.bench.report import read_csv
from engine.bench.study.fit import prediction_markdown
from engine.bench.study.model import ENGINES, HOST_PLANS, StepCosts
from engine.bench.study.sim import simulate_closed_loop
from engine.fixture.known.modelled import AcceptanceProfile, parse_profile
from engine.graphs import batch_buckets
from engine.policy.costs import CostTable
from engine.scheduler import Plan

log = logging.getLogger(__name__)


def step_features(
    table: CostTable, c: int, requests: int, new_tokens: int, drafts: int | None, rates, gate, buckets, seeds
) -> tuple[float, np.ndarray, int]:
    """(device ms, the terms' coefficients, tokens) of one arm-run's replay on the profile's class `rates`,
    averaged over seeds: per plan [steps, sum of batches], then per engine [prefill steps, requests admitted]."""
    device, coef = 0.0, np.zeros(2 * len(HOST_PLANS) + 2 * len(ENGINES))
    bare = StepCosts(table, prefill={e: {1: 0.0, requests: 0.0} for e in ENGINES})
    for seed in seeds:
        res = simulate_closed_loop(bare, c, requests, new_tokens, drafts, (), gate, buckets, seed, classes=rates)
        for plan, n in res.steps:
            if plan == Plan.PREFILL.value:
                i = 2 * len(HOST_PLANS) + 2 * ENGINES.index("plain" if drafts is None else "spec")
            else:
                rows = next((b for b in buckets if b >= n), n)
                device += bare.step_ms(plan, n, rows, drafts or 0)
                i = 2 * HOST_PLANS.index(plan)
            coef[i : i + 2] += (1, n)
    return device / len(seeds), coef / len(seeds), res.tokens


def refit(runs: Sequence[tuple[float, float, np.ndarray]]) -> np.ndarray:
    """The terms (step_features' order) from runs of (measured wall ms, replayed device ms,
    coefficients); terms no run exercises stay 0."""
    a = np.array([coef / wall for wall, _, coef in runs])
    y = np.array([(wall - device) / wall for wall, device, _ in runs])
    used = np.flatnonzero(a.any(axis=0))
    theta = np.zeros(a.shape[1])
    theta[used] = np.linalg.lstsq(a[:, used], y, rcond=None)[0]
    return theta


def terms_markdown(theta: np.ndarray) -> str:
    names = [f"{p} host {t}" for p in HOST_PLANS for t in ("a", "b")]
    names += [f"{e} prefill {t}" for e in ENGINES for t in ("p0", "p1")]
    return ", ".join(f"{n} {v:.4g}" for n, v in zip(names, theta, strict=True))


def refit_study(
    directory: Path, new_tokens: int, waves_for, seeds: Sequence[int] = tuple(range(8))
) -> tuple[str, dict]:
    """Refit on a study's CSVs and score each summary cell: (markdown, fit dict)."""
    prof = read_csv(directory / "profile.csv")
    spec_rows = [r for r in prof if r["engine"] == "known+drafter"]
    table = CostTable.from_rows(spec_rows, [r for r in prof if r["engine"] == "known plain"])
    per_round = next(int(r["span"]) for r in spec_rows if r["kind"] == "draft")
    sweep, summary = read_csv(directory / "sweep.csv"), read_csv(directory / "summary.csv")
    max_c = max(int(r["concurrency"]) for r in sweep)
    buckets = batch_buckets(max_c)
    profiles: dict[str, AcceptanceProfile] = {}
    cache: dict[tuple, tuple] = {}

    def replay(c: int, label: str, name: str) -> tuple:
        if (c, label, name) not in cache:
            profile = profiles.setdefault(name, parse_profile(name).first(per_round))
            arm = parse_arm(label)
            drafts = arm_drafts(arm, per_round)
            cache[c, label, name] = step_features(
                table, c, waves_for(c) * c, new_tokens, drafts, profile.rates(), arm.gate, buckets, seeds
            )
        return cache[c, label, name]

    runs = []
    for r in sweep:
        device, coef, _ = replay(int(r["concurrency"]), r["arm"], r["profile"])
        runs.append((1e3 * float(r["wall_s"]), device, coef))
    theta = refit(runs)
    cells = []
    for s in summary:
        device, coef, tokens = replay(int(s["concurrency"]), s["arm"], s["profile"])
        cells.append({**s, "tok_s": float(s["tok_s"]), "predicted_tok_s": 1e3 * tokens / (device + coef @ theta)})
    text, fit = prediction_markdown(cells)
    head = "Refit on this run's own walls (in-sample: a check of the model's structure, not a prediction)"
    return f"{head}; terms (ms): {terms_markdown(theta)}.\n\n{text}", {**fit, "terms": theta.tolist()}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine.bench study-refit", description=__doc__.split("\n\n")[0])
    p.add_argument("study", type=Path, help="a study's output directory")
    p.add_argument("--new-tokens", type=int, default=64, help="the study's --new-tokens")
    args = p.parse_args(argv)
    from engine.bench.study.run import waves_for

    try:
        text, _ = refit_study(args.study, args.new_tokens, waves_for)
    except (OSError, KeyError, ValueError) as err:
        raise SystemExit(f"{args.study}: {type(err).__name__}: {err}") from None
    print(text)
    return 0
