"""How well the cost model predicts the study's sweep (per cell: predicted vs measured tok/s, the count
within the bar) and what its calibrated host and prefill terms are (model.py)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from engine.bench.report import fmt, markdown_table, pct
from engine.bench.study.model import StepCosts
from engine.scheduler import Plan

PREDICTION_BAR = 0.10  # a prediction within 10 % of the measured tok/s meets the bar


def prediction_error(cell: dict) -> float | None:
    """predicted / measured - 1 of one summary cell (None without a prediction)."""
    pred, meas = cell.get("predicted_tok_s"), cell.get("tok_s")
    return pred / meas - 1 if pred and meas else None


def prediction_fit(summary: Sequence[dict], bar: float = PREDICTION_BAR) -> dict:
    """{cells, within, median_abs_error, worst, by_profile: {name: [within, cells]}} over the cells
    that have a prediction."""
    errors = [(s, e) for s in summary if (e := prediction_error(s)) is not None]
    by_profile: dict[str, list[int]] = {}
    for s, e in errors:
        counts = by_profile.setdefault(s.get("profile", ""), [0, 0])
        counts[0] += abs(e) <= bar
        counts[1] += 1
    fit = dict(bar=bar, cells=len(errors), within=sum(abs(e) <= bar for _, e in errors))
    fit["median_abs_error"] = statistics.median(abs(e) for _, e in errors) if errors else None
    return fit | dict(worst=max((e for _, e in errors), key=abs, default=None), by_profile=by_profile)


def prediction_markdown(summary: Sequence[dict], bar: float = PREDICTION_BAR) -> tuple[str, dict]:
    """The headline (cells within the bar, per profile), the misses as a table, and the fit dict."""
    fit = prediction_fit(summary, bar)
    if not fit["cells"]:
        return "**Cost model vs measured**: no cell has a prediction.\n", fit
    per = ", ".join(f"`{p}` {w} of {n}" for p, (w, n) in fit["by_profile"].items())
    text = (
        f"**Cost model vs measured**: {fit['within']} of {fit['cells']} (c, profile, arm) cells within "
        f"±{100 * bar:.0f} % ({per}); median |error| {100 * fit['median_abs_error']:.1f} %, "
        f"worst {pct(1 + fit['worst'])}.\n\n"
    )
    misses = [
        [s.get("profile", ""), s["concurrency"], s["arm"], fmt(s["predicted_tok_s"], 0), fmt(s["tok_s"], 0), pct(1 + e)]
        for s in summary
        if (e := prediction_error(s)) is not None and abs(e) > bar
    ]
    if misses:
        header = ["profile", "c", "arm", "predicted tok/s", "measured tok/s", "error"]
        text += f"Cells outside ±{100 * bar:.0f} %:\n\n" + markdown_table(header, misses) + "\n"
    return text, fit


def round_markdown(rows: Sequence[dict], summary: Sequence[dict], bar: float = PREDICTION_BAR) -> str:
    """Each measured run against its cell's prediction, by round (a one-off a round pays shows as its
    bias), and the graphs the runs captured."""
    pred = {(s.get("profile", ""), s["concurrency"], s["arm"]): s.get("predicted_tok_s") for s in summary}
    by_round: dict[int, list[float]] = {}
    for r in rows:
        p = pred.get((r.get("profile", ""), r["concurrency"], r["arm"]))
        if p and r.get("tok_s"):
            by_round.setdefault(r["round"], []).append(p / r["tok_s"] - 1)
    parts = [
        f"round {k}: {sum(abs(e) <= bar for e in v)} of {len(v)} within ±{100 * bar:.0f} %, "
        f"mean error {pct(1 + statistics.fmean(v))}"
        for k, v in sorted(by_round.items())
    ]
    text = f"Per measured run against its cell's prediction: {'; '.join(parts)}.\n" if parts else ""
    captures = [r["graph_captures"] for r in rows if r.get("graph_captures") is not None]
    if captures:
        text += f"Graphs captured during measured runs: {sum(captures)} (in {sum(n > 0 for n in captures)} runs).\n"
    return text


def calibration_markdown(costs: StepCosts) -> str:
    """The calibrated terms: host ms per step by plan and batch, prefill ms by engine and requests."""
    per_k = bool(costs.spec_host)  # the speculative round's terms by K replace their median
    terms = {plan: points for plan, points in costs.host.items() if not (per_k and plan == Plan.SPECULATIVE.value)}
    terms |= {f"{Plan.SPECULATIVE.value} K={k}": points for k, points in sorted(costs.spec_host.items())}
    batches = sorted({b for points in terms.values() for b in points})
    rows = [[plan, *(fmt(points.get(b), 3) for b in batches)] for plan, points in terms.items()]
    text = "Host ms per step (median wall of engine.step() minus the table's device ms), by batch:\n\n"
    text += markdown_table(["plan", *(str(b) for b in batches)], rows) + "\n\n"
    ns = sorted({n for points in costs.prefill.values() for n in points})
    rows = [[engine, *(fmt(points.get(n), 2) for n in ns)] for engine, points in costs.prefill.items()]
    text += "Prefill step wall, ms (median; a graph up to 2,048 tokens; add_request included), by requests:\n\n"
    return text + markdown_table(["engine", *(str(n) for n in ns)], rows) + "\n"
