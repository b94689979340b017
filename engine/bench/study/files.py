"""A study's report from its files (profile.csv, calibration.csv, sweep.csv, meta.json, checks.json,
draws.npz where written), on any machine: study.md, summary.csv and the PNGs of a run cut short.

    python -m engine.bench study-files [--rebuild-draws] DIR   (--rebuild-draws: on the study's GPU type)
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from engine.bench.arms import parse_arms
from engine.bench.report import read_csv
from engine.bench.study.draws import StudyDraws, rebuild_draws
from engine.bench.study.model import StepCosts
from engine.bench.study.report import write_study
from engine.bench.study.run import _parser, study_prompts, waves_for
from engine.fixture.known.modelled import parse_profile
from engine.policy.costs import CostTable

PROFILED = {"spec": "known+drafter", "plain": "known plain", "random": "random plain"}


def typed(row: dict) -> dict:
    """A CSV row's cells as the study wrote them: '' -> None, numbers as int or float."""
    out = {}
    for key, value in row.items():
        if value == "":
            out[key] = None
            continue
        for kind in (int, float):
            try:
                out[key] = kind(value)
                break
            except ValueError:
                pass
        else:
            out[key] = value
    return out


def report(directory: Path) -> None:
    """study.md, summary.csv, study.json and the PNGs from a study directory's files (report.py)."""
    meta = json.loads((directory / "meta.json").read_text())
    checked = directory / "checks.json"
    checks = json.loads(checked.read_text()) if checked.is_file() else {"echo": None, "lossless": None}
    args = _parser().parse_args([*meta["argv"], "--out", str(directory)])
    profiled_rows = [typed(r) for r in read_csv(directory / "profile.csv")]
    profiled = {key: [r for r in profiled_rows if r["engine"] == name] for key, name in PROFILED.items()}
    table = CostTable.from_rows(profiled["spec"], profiled["plain"])
    costs = StepCosts.from_rows(table, read_csv(directory / "calibration.csv"))
    per_round = next(r["span"] for r in profiled["spec"] if r["kind"] == "draft")
    profiles = [parse_profile(p).first(per_round) for p in args.profiles]
    arms = parse_arms(args.arms, noise_arm=True, spec_noise_arm=True)
    rows = [typed(r) for r in read_csv(directory / "sweep.csv")]
    echo, lossless = checks["echo"], checks["lossless"]
    draws = StudyDraws.load(directory)
    write_study(args, meta, profiles, arms, rows, profiled, echo, lossless, costs, waves_for, meta["buckets"], draws)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine.bench study-files", description=__doc__.split("\n\n")[0])
    p.add_argument("study", type=Path, help="a study's output directory")
    p.add_argument("--rebuild-draws", action="store_true", help="rebuild draws.npz from meta.json first")
    args = p.parse_args(argv)
    try:
        if args.rebuild_draws:
            print(f"wrote {rebuild_draws(args.study, _parser(), study_prompts, waves_for)}")
        report(args.study)
    except (OSError, KeyError, ValueError) as err:
        raise SystemExit(f"{args.study}: {type(err).__name__}: {err}") from None
    return 0
