"""The step costs beside the device table: host lines fitted from synthetic step timings, prefill walls
by engine and requests, calibration rows in their CSV form, and how the study reports the fit."""

from __future__ import annotations

import pytest

from engine.bench.calibrate import budget_tokens, calibrate
from engine.bench.costmodel import CostTable
from engine.bench.stepcosts import HostFit, StepCosts, fit_host
from engine.bench.study_fit import calibration_markdown, prediction_fit, prediction_markdown
from engine.scheduler import Plan

DECODE, GATED, SPEC, PREFILL = (p.value for p in (Plan.DECODE, Plan.GATED, Plan.SPECULATIVE, Plan.PREFILL))


def table() -> CostTable:
    """verify = 3 ms + 0.01 ms per row; drafter 0.6 ms + 0.04 ms per request; plain 2.9 ms + 0.008/row."""
    batches = (1, 16, 64, 256)
    verify = {(b, s): 3.0 + 0.01 * b * s for b in batches for s in (1, 3, 16)}
    return CostTable(verify, {b: 0.6 + 0.04 * b for b in batches}, {b: 2.9 + 0.008 * b for b in batches})


def synthetic_rows(host: dict[str, HostFit], prefill: dict[str, float], jitter: float = 0.0) -> list[dict]:
    """Calibration rows as calibrate() writes them, timings built from known terms (string values, as
    read back from calibration.csv); jitter alternates +/- so a least-squares fit cancels it."""
    t, rows = table(), []
    for i, b in enumerate((1, 16, 64, 256)):
        sign = jitter if i % 2 else -jitter
        for plan, engine, drafts in ((DECODE, "plain", 0), (GATED, "spec", 0), (SPEC, "spec", 2), (SPEC, "spec", 15)):
            device = StepCosts(t).step_ms(plan, b, b, drafts)
            wall = device + host[plan].ms(b) + sign
            row = {"kind": "host", "engine": engine, "plan": plan, "batch": str(b)}
            rows.append({**row, "host_ms": str(wall - device)})
            wall = prefill[engine] + 0.05 * b
            for extra in (0.0, 0.3, 5.0):  # the median of three drops one slow outlier
                row = {"kind": "prefill", "engine": engine, "plan": PREFILL, "batch": str(b)}
                rows.append({**row, "wall_ms": str(wall + extra)})
    return rows


def test_fit_host_recovers_a_line_and_refuses_no_samples():
    fit = fit_host([(b, 0.3 + 0.008 * b) for b in (1, 16, 64, 256)])
    assert (fit.a, fit.b) == (pytest.approx(0.3), pytest.approx(0.008))
    assert fit.ms(128) == pytest.approx(0.3 + 0.008 * 128)
    assert fit_host([(4, 1.0), (4, 2.0)]) == HostFit(1.5, 0.0)  # one batch: flat at the mean
    assert HostFit(-1.0, 0.001).ms(10) == 0.0  # a step never costs negative host time
    with pytest.raises(ValueError, match="at least one"):
        fit_host([])
    with pytest.raises(ValueError, match=">= 1"):
        fit_host([(0, 1.0), (4, 1.0)])


def test_step_costs_fitted_from_synthetic_timings():
    host = {DECODE: HostFit(0.29, 0.0083), GATED: HostFit(0.09, 0.0044), SPEC: HostFit(0.5, 0.0096)}
    costs = StepCosts.from_rows(table(), synthetic_rows(host, {"plain": 9.0, "spec": 17.8}, jitter=0.05))
    for plan, want in host.items():
        assert costs.host[plan].a == pytest.approx(want.a, abs=0.06)
        assert costs.host[plan].b == pytest.approx(want.b, abs=1e-3)
    assert costs.prefill_ms("spec", 16) == pytest.approx(17.8 + 0.8 + 0.3)  # the median of three
    assert costs.prefill_ms("plain", 40) == pytest.approx(9.0 + 0.05 * 40 + 0.3)  # between 16 and 64
    t = table()
    exact = StepCosts.from_rows(t, synthetic_rows(host, {"plain": 9.0, "spec": 17.8}))
    assert exact.step_ms(SPEC, 60, 64, 2) == pytest.approx(t.round_ms(64, 2) + host[SPEC].ms(60))  # padded to 64
    assert exact.step_ms(DECODE, 16, 16) == pytest.approx(t.decode_ms(16) + host[DECODE].ms(16))
    assert exact.step_ms(GATED, 1, 1) == pytest.approx(t.gated_ms(1) + host[GATED].ms(1))


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


def test_calibration_markdown_lists_the_terms():
    host = {DECODE: HostFit(0.29, 0.0083), GATED: HostFit(0.09, 0.0044), SPEC: HostFit(0.5, 0.0096)}
    costs = StepCosts.from_rows(table(), synthetic_rows(host, {"plain": 9.0, "spec": 17.8}))
    text = calibration_markdown(costs, [1, 256])
    assert "| SpeculativeDecode | 0.500 | 0.00960 | 0.510 | 2.958 |" in text
    assert "| spec | 18.15 | 18.90 | 21.30 | 30.90 |" in text
