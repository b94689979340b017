"""What one engine step costs end to end, for the closed-loop replay (engine/bench/costsim.py): the
device table (engine/costs.py CostTable: graph replays) plus the two terms it does not see, both
calibrated on the same engines in the same run (engine/bench/calibrate.py):

- host time per step, per plan (plain decode, gated round, speculative round), a line in the batch:
  the wall of `engine.step()` minus the device time of its graph replays (see calibrate.py for why);
- the wall of a prefill step admitting n requests (eager, launch-bound: not a graph replay), per
  engine (the speculative engine's prefill also stores the drafter's context).

Calibration rows (calibration.csv): {kind, engine, plan, batch, drafts, wall_ms, device_ms, host_ms}:
kind `host` (the median wall of steady steps of `batch` requests, `drafts` per round, and host_ms =
wall_ms - device_ms) or `prefill` (the wall of one prefill step admitting `batch` requests).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from engine.costs import CostTable
from engine.scheduler import Plan

HOST_PLANS = (Plan.DECODE.value, Plan.GATED.value, Plan.SPECULATIVE.value)
ENGINES = ("plain", "spec")


@dataclass(frozen=True)
class HostFit:
    """Host ms of one step of `batch` requests: a + b * batch (never below 0)."""

    a: float = 0.0
    b: float = 0.0

    def ms(self, batch: int) -> float:
        return max(0.0, self.a + self.b * batch)


def fit_host(samples: Sequence[tuple[int, float]]) -> HostFit:
    """Least-squares line through (batch, host ms) samples; one distinct batch gives a flat line."""
    if not samples:
        raise ValueError("fit_host needs at least one (batch, ms) sample")
    xs, ys = [float(x) for x, _ in samples], [float(y) for _, y in samples]
    if min(xs) < 1:
        raise ValueError(f"fit_host: batches must be >= 1, got {sorted(set(xs))}")
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return HostFit(my, 0.0)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return HostFit(my - b * mx, b)


@dataclass
class StepCosts:
    """The table's device ms plus host[plan] per step and prefill[engine][n] per prefill step."""

    table: CostTable
    host: dict[str, HostFit] = field(default_factory=dict)
    prefill: dict[str, dict[int, float]] = field(default_factory=dict)

    @classmethod
    def from_rows(cls, table: CostTable, rows: Iterable[dict]) -> StepCosts:
        """From calibration rows (dicts or CSV rows of strings): host lines fitted per plan, the
        median prefill wall per (engine, batch)."""
        samples: dict[str, list[tuple[int, float]]] = {}
        prefill: dict[str, dict[int, list[float]]] = {}
        for r in rows:
            kind, engine, batch = r["kind"], r["engine"], int(r["batch"])
            if kind == "host":
                if r["plan"] not in HOST_PLANS:
                    raise ValueError(f"calibration row {r}: plan must be one of {HOST_PLANS}")
                samples.setdefault(r["plan"], []).append((batch, float(r["host_ms"])))
            elif kind == "prefill":
                if engine not in ENGINES:
                    raise ValueError(f"calibration row {r}: engine must be one of {ENGINES}")
                wall = float(r["wall_ms"])
                if wall <= 0:
                    raise ValueError(f"calibration row {r}: wall_ms must be > 0")
                prefill.setdefault(engine, {}).setdefault(batch, []).append(wall)
            else:
                raise ValueError(f"calibration row {r}: unknown kind {kind!r} (host or prefill)")
        medians = {e: {b: sorted(v)[len(v) // 2] for b, v in per.items()} for e, per in prefill.items()}
        return cls(table, {p: fit_host(s) for p, s in samples.items()}, medians)

    def host_ms(self, plan: str, batch: int) -> float:
        fit = self.host.get(plan)
        return 0.0 if fit is None else fit.ms(batch)

    def prefill_ms(self, engine: str, n: int) -> float:
        points = self.prefill.get(engine)
        if not points:
            raise ValueError(f"no prefill calibration for the {engine} engine")
        return _interpolate(points, n, f"{engine} prefill")

    def step_ms(self, plan: str, batch: int, rows: int, drafts: int = 0) -> float:
        """One decode-side step of `batch` requests whose graphs run at `rows` (the padded bucket)."""
        if plan == Plan.DECODE.value:
            device = self.table.decode_ms(rows)
        elif plan == Plan.GATED.value:
            device = self.table.gated_ms(rows)
        elif plan == Plan.SPECULATIVE.value:
            device = self.table.round_ms(rows, drafts)
        else:
            raise ValueError(f"plan {plan!r}: not a decode-side step ({', '.join(HOST_PLANS)})")
        return device + self.host_ms(plan, batch)


def _interpolate(points: dict[int, float], x: int, what: str) -> float:
    xs = sorted(points)
    if not xs[0] <= x <= xs[-1]:
        raise ValueError(f"{what}: {x} requests outside the calibrated range {xs[0]}..{xs[-1]}")
    i = bisect.bisect_left(xs, x)
    if xs[i] == x:
        return points[x]
    x0, x1 = xs[i - 1], xs[i]
    return points[x0] + (points[x1] - points[x0]) * (x - x0) / (x1 - x0)
