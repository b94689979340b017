"""The step costs beside the device table: host terms fitted from synthetic step timings, prefill walls
by engine and requests, calibration rows in their CSV form, and how the study reports the fit."""

from __future__ import annotations

import argparse
import itertools
import statistics

import pytest

from engine.bench.arms import arm_drafts, parse_arm
from engine.bench.report import write_csv
from engine.bench.study.fit import calibration_markdown, prediction_fit, prediction_markdown, round_markdown
from engine.bench.study.model import StepCosts
from engine.bench.study.refit import main as refit_main
from engine.bench.study.refit import refit_study
from engine.bench.study.run import main as study_main
from engine.bench.study.run import waves_for
from engine.bench.study.sim import simulate_closed_loop
from engine.bench.study.step_walls import budget_tokens, calib_batches, calibrate
from engine.fixture.known.modelled import parse_profile
from engine.policy.costs import CostTable
from engine.scheduler import Plan

DECODE, GATED, SPEC, PREFILL = (p.value for p in (Plan.DECODE, Plan.GATED, Plan.SPECULATIVE, Plan.PREFILL))


def table() -> CostTable:
    """verify = 3 ms + 0.01 ms per row; drafter 0.6 ms + 0.04 ms per request; plain 2.9 ms + 0.008/row."""
    batches = (1, 16, 64, 256)
    verify = {(b, s): 3.0 + 0.01 * b * s for b in batches for s in (1, 3, 16)}
    return CostTable(verify, {b: 0.6 + 0.04 * b for b in batches}, {b: 2.9 + 0.008 * b for b in batches})


def line(a: float, b: float):
    return lambda batch: a + b * batch


HOST = {DECODE: line(0.29, 0.0083), GATED: line(0.09, 0.0044), SPEC: line(0.5, 0.0096)}


def synthetic_rows(prefill: dict[str, float], jitter: float = 0.0) -> list[dict]:
    """Calibration rows as calibrate() writes them for two repeats, timings built from known terms
    (HOST, prefill + 0.05 ms per request; string values, as read back from calibration.csv); the
    repeats' jitter is +/- so their median cancels it."""
    t, rows = table(), []
    cases = ((DECODE, "plain", 0), (GATED, "spec", 0), (SPEC, "spec", 2), (SPEC, "spec", 15))
    for b, (plan, engine, drafts), sign in itertools.product((1, 16, 64, 256), cases, (jitter, -jitter)):
        device = StepCosts(t).step_ms(plan, b, b, drafts)
        wall = device + HOST[plan](b) + sign
        rows.append({"kind": "host", "engine": engine, "plan": plan, "batch": str(b), "host_ms": str(wall - device)})
        for extra in (0.0, 0.3, 5.0):  # the median drops the slow outlier
            wall = prefill[engine] + 0.05 * b + extra
            rows.append({"kind": "prefill", "engine": engine, "plan": PREFILL, "batch": str(b), "wall_ms": str(wall)})
    return rows


def test_host_terms_from_synthetic_timings_are_the_medians_per_batch():
    costs = StepCosts.from_rows(table(), synthetic_rows({"plain": 9.0, "spec": 17.8}, jitter=0.05))
    for plan, want in HOST.items():
        for b in (1, 16, 64, 256):
            assert costs.host_ms(plan, b) == pytest.approx(want(b))
        assert costs.host_ms(plan, 40) == pytest.approx(want(40))  # linear between calibrated batches
    assert costs.prefill_ms("spec", 16) == pytest.approx(17.8 + 0.8 + 0.3)
    assert costs.prefill_ms("plain", 40) == pytest.approx(9.0 + 0.05 * 40 + 0.3)  # between 16 and 64
    t = table()
    assert costs.step_ms(SPEC, 60, 64, 2) == pytest.approx(t.round_ms(64, 2) + HOST[SPEC](60))  # graphs at 64
    assert costs.step_ms(DECODE, 16, 16) == pytest.approx(t.decode_ms(16) + HOST[DECODE](16))
    assert costs.step_ms(GATED, 1, 1) == pytest.approx(t.gated_ms(1) + HOST[GATED](1))
    # A step whose graphs beat the table's proxy: the negative residual corrects the device term.
    fast = StepCosts(t, {DECODE: {1: -0.2, 256: -0.2}})
    assert fast.step_ms(DECODE, 8, 8) == pytest.approx(t.decode_ms(8) - 0.2)
    with pytest.raises(ValueError, match="batch 512 outside the calibrated range 1..256"):
        costs.host_ms(DECODE, 512)


def test_a_speculative_round_takes_the_host_term_of_its_drafts():
    # The H200 4B study at batch 256: +1.6 ms at K = 2 and -1.8 ms at K = 15 (the table's span-16 verify
    # runs slow); their median, -0.3 ms, made every trim 11-18 % too fast there.
    rows = [
        {"kind": "host", "engine": "spec", "plan": SPEC, "batch": str(b), "drafts": str(k), "host_ms": str(ms)}
        for b, k, ms in ((1, 2, 0.2), (256, 2, 1.6), (1, 15, 0.1), (256, 15, -1.8))
    ]
    costs = StepCosts.from_rows(table(), rows)
    assert costs.host_ms(SPEC, 256, 2) == pytest.approx(1.6) and costs.host_ms(SPEC, 256, 15) == pytest.approx(-1.8)
    assert costs.host_ms(SPEC, 256, 4) == pytest.approx(1.6 - 3.4 * 2 / 13)  # linear in K between them
    assert costs.host_ms(SPEC, 256, 1) == pytest.approx(1.6)  # outside the calibrated K: the nearest
    assert costs.host_ms(SPEC, 128, 2) == pytest.approx(0.2 + 1.4 * 127 / 255)  # linear in batch first
    assert costs.host_ms(SPEC, 256) == pytest.approx((1.6 - 1.8) / 2)  # no K given: the median over K
    assert costs.step_ms(SPEC, 256, 256, 15) == pytest.approx(table().round_ms(256, 15) - 1.8)


def test_step_costs_refuse_bad_rows_and_uncalibrated_lookups():
    costs = StepCosts.from_rows(table(), [])
    assert costs.step_ms(DECODE, 4, 16) == table().decode_ms(16)  # no host rows: the device alone
    with pytest.raises(ValueError, match="no prefill calibration"):
        costs.prefill_ms("spec", 1)
    calibrated = StepCosts(table(), prefill={"spec": {1: 18.0, 64: 25.0}})
    with pytest.raises(ValueError, match="outside the calibrated range 1..64"):
        calibrated.prefill_ms("spec", 128)
    with pytest.raises(ValueError, match="not a decode-side step"):
        costs.step_ms(PREFILL, 1, 1)
    bad = [
        ({"kind": "steps", "engine": "spec", "batch": 1}, "unknown kind"),
        ({"kind": "host", "engine": "spec", "plan": "Prefill", "batch": 1, "host_ms": 1}, "plan must be"),
        ({"kind": "prefill", "engine": "eager", "plan": PREFILL, "batch": 1, "wall_ms": 1}, "engine must be"),
        ({"kind": "prefill", "engine": "spec", "plan": PREFILL, "batch": 1, "wall_ms": 0}, "> 0"),
    ]
    for row, match in bad:
        with pytest.raises(ValueError, match=match):
            StepCosts.from_rows(table(), [row])


def test_calibrate_refuses_bad_points_before_touching_an_engine():
    with pytest.raises(ValueError, match="must be >= 1 and <= 2 prompts"):
        calibrate({}, table(), [[1], [2]], [1, 4], [2])
    with pytest.raises(ValueError, match="repeats, steps >= 1"):
        calibrate({}, table(), [[1], [2]], [1, 2], [2], repeats=0)
    assert budget_tokens(6, 15) == 7 * 16 + 1  # six full 16-token rounds after the prefill's token


def summary_cell(profile: str, c: int, arm: str, measured: float, predicted: float | None) -> dict:
    return {"profile": profile, "concurrency": c, "arm": arm, "tok_s": measured, "predicted_tok_s": predicted}


def test_prediction_fit_counts_the_cells_within_the_bar():
    cells = [
        summary_cell("code", 1, "plain", 300.0, 309.0),  # +3 %
        summary_cell("code", 1, "spec", 870.0, 1535.0),  # +76 %
        summary_cell("chat", 64, "spec", 100.0, 91.0),  # -9 %
        summary_cell("chat", 64, "plain", 100.0, None),  # no prediction: not a cell
    ]
    fit = prediction_fit(cells)
    assert (fit["cells"], fit["within"]) == (3, 2)
    assert fit["by_profile"] == {"code": [1, 2], "chat": [1, 1]}
    assert fit["worst"] == pytest.approx(1535 / 870 - 1)
    text, _ = prediction_markdown(cells)
    assert "2 of 3 (c, profile, arm) cells within ±10 %" in text
    assert "| code | 1 | spec | 1,535 | 870 | +76.4 % |" in text and "| chat | 64 | spec |" not in text
    assert "no cell" in prediction_markdown([cells[-1]])[0]


def test_each_run_is_scored_by_round_and_the_graphs_runs_captured_are_counted():
    cells = [summary_cell("code", 64, "spec", 100.0, 100.0), summary_cell("code", 64, "plain", 50.0, None)]
    run = {"profile": "code", "concurrency": 64, "arm": "spec"}
    rows = [{**run, "round": 1, "tok_s": 80.0, "graph_captures": 2}, {**run, "round": 2, "tok_s": 104.0}]
    rows += [
        {**run, "round": 2, "tok_s": 96.0, "graph_captures": 0},
        {**run, "arm": "plain", "round": 1, "tok_s": 50.0},
    ]
    text = round_markdown(rows, cells)  # round 1 paid 2 captures: +25 %; round 2 within
    assert "round 1: 0 of 1 within ±10 %, mean error +25.0 %; round 2: 2 of 2 within ±10 %" in text
    assert "Graphs captured during measured runs: 2 (in 1 runs)." in text
    assert round_markdown([], cells) == ""


def test_calibration_markdown_lists_the_terms():
    text = calibration_markdown(StepCosts.from_rows(table(), synthetic_rows({"plain": 9.0, "spec": 17.8})))
    assert "| SpeculativeDecode | 0.510 | 0.654 | 1.114 | 2.958 |" in text
    assert "| spec | 18.15 | 18.90 | 21.30 | 30.90 |" in text


def test_the_refit_recovers_walls_built_from_known_terms(tmp_path):
    spans = range(1, 5)  # a 3-draft drafter
    profile = [
        {"engine": "known+drafter", "kind": "verify", "batch": b, "span": s, "ms": 3 + 0.01 * b * s}
        for b in (1, 4)
        for s in spans
    ]
    profile += [
        {"engine": "known+drafter", "kind": "draft", "batch": b, "span": 3, "ms": 0.6 + 0.1 * b} for b in (1, 4)
    ]
    profile += [{"engine": "known plain", "kind": "verify", "batch": b, "span": 1, "ms": 2.9} for b in (1, 4)]
    write_csv(tmp_path / "profile.csv", profile)
    t = CostTable.from_rows(profile[:-2], profile[-2:])
    truth = StepCosts(
        t,
        {plan: {1: HOST[plan](1), 4: HOST[plan](4)} for plan in HOST},
        {"plain": {1: 9.0, 4: 9.3}, "spec": {1: 17.8, 4: 18.4}},
    )
    sweep, summary = [], []
    for c, label in itertools.product((1, 4), ("plain", "spec", "spec+trim=2", "spec+gate=4")):
        arm, cond = parse_arm(label), parse_profile("code").first(3).conditional
        runs = [
            simulate_closed_loop(truth, c, waves_for(c) * c, 9, arm_drafts(arm, 3), cond, arm.gate, seed=s)
            for s in (0, 1, 2)
        ]
        wall = statistics.mean(r.ms for r in runs) / 1e3
        sweep.append({"profile": "code", "concurrency": c, "arm": label, "wall_s": wall})
        summary.append({"profile": "code", "concurrency": c, "arm": label, "tok_s": runs[0].tokens / wall})
    write_csv(tmp_path / "sweep.csv", sweep)
    write_csv(tmp_path / "summary.csv", summary)
    text, fit = refit_study(tmp_path, 9, waves_for)
    assert (fit["within"], fit["cells"]) == (8, 8) and abs(fit["worst"]) < 1e-6
    assert text.startswith("Refit on this run's own walls (in-sample")
    with pytest.raises(SystemExit, match="FileNotFoundError"):
        refit_main([str(tmp_path / "missing")])


def test_calibration_batches_default_to_every_concurrency_and_bad_flags_are_refused(tmp_path):
    args = argparse.Namespace(concurrency=[4, 1, 16], calib_batches=None, calib_steps=6, calib_repeats=2)
    assert calib_batches(args) == [1, 4, 16]
    assert calib_batches(argparse.Namespace(**{**vars(args), "calib_batches": [8]})) == [1, 8, 16]
    for flags, match in (
        (["--calib-batches", "32"], r"each must be in 1..16"),
        (["--calib-batches", "0"], r"each must be in 1..16"),
        (["--calib-steps", "0"], ">= 1"),
        (["--calib-repeats", "0"], ">= 1"),
    ):
        with pytest.raises(SystemExit, match=match):
            study_main(["--out", str(tmp_path), "--concurrency", "1", "16", *flags])


@pytest.mark.parametrize("budget", ["-1", "nan"])
def test_a_negative_graph_budget_is_refused(tmp_path, budget):
    with pytest.raises(SystemExit, match="--graphs-budget-s must be >= 0"):
        study_main(["--out", str(tmp_path), "--graphs-budget-s", budget])
