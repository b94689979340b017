"""What one engine step costs end to end, for the closed-loop replay (engine/bench/costsim.py): the
device table (engine/costs.py CostTable: graph replays) plus the two terms it does not see, both
calibrated on the same engines in the same run (engine/bench/calibrate.py):

- host time per step, per plan (plain decode, gated round, speculative round) and batch: the wall of
  `engine.step()` minus the device time of its graph replays (see calibrate.py for why), the median
  per calibrated batch and linear between them (it also absorbs where a step's graphs differ from
  the table's at that batch, e.g. the plain decode graph against the profiled span-1 verify);
- the wall of a prefill step admitting n requests (eager, launch-bound: not a graph replay), per
  engine (the speculative engine's prefill also stores the drafter's context).

Calibration rows (calibration.csv): {kind, engine, plan, batch, drafts, wall_ms, device_ms, host_ms}:
kind `host` (the median wall of steady steps of `batch` requests, `drafts` per round, and host_ms =
wall_ms - device_ms) or `prefill` (the wall of one prefill step admitting `batch` requests).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field

from engine.costs import CostTable, interpolate
from engine.scheduler import Plan

HOST_PLANS = (Plan.DECODE.value, Plan.GATED.value, Plan.SPECULATIVE.value)
ENGINES = ("plain", "spec")


@dataclass
class StepCosts:
    """The table's device ms plus host[plan][batch] per step and prefill[engine][n] per prefill step."""

    table: CostTable
    host: dict[str, dict[int, float]] = field(default_factory=dict)
    prefill: dict[str, dict[int, float]] = field(default_factory=dict)

    @classmethod
    def from_rows(cls, table: CostTable, rows: Iterable[dict]) -> StepCosts:
        """From calibration rows (dicts or CSV rows of strings): the median host ms per (plan, batch)
        and the median prefill wall per (engine, batch)."""
        host: dict[str, dict[int, list[float]]] = {}
        prefill: dict[str, dict[int, list[float]]] = {}
        for r in rows:
            kind, engine, batch = r["kind"], r["engine"], int(r["batch"])
            if kind == "host":
                if r["plan"] not in HOST_PLANS:
                    raise ValueError(f"calibration row {r}: plan must be one of {HOST_PLANS}")
                host.setdefault(r["plan"], {}).setdefault(batch, []).append(float(r["host_ms"]))
            elif kind == "prefill":
                if engine not in ENGINES:
                    raise ValueError(f"calibration row {r}: engine must be one of {ENGINES}")
                wall = float(r["wall_ms"])
                if wall <= 0:
                    raise ValueError(f"calibration row {r}: wall_ms must be > 0")
                prefill.setdefault(engine, {}).setdefault(batch, []).append(wall)
            else:
                raise ValueError(f"calibration row {r}: unknown kind {kind!r} (host or prefill)")
        return cls(table, _medians(host), _medians(prefill))

    def host_ms(self, plan: str, batch: int) -> float:
        """0 for an uncalibrated plan. It may be negative: where the step's graphs run faster than
        the table's proxy for them, the residual corrects the table."""
        points = self.host.get(plan)
        return 0.0 if not points else interpolate(points, batch, f"{plan} host", "calibrated")

    def prefill_ms(self, engine: str, n: int) -> float:
        points = self.prefill.get(engine)
        if not points:
            raise ValueError(f"no prefill calibration for the {engine} engine")
        return interpolate(points, n, f"{engine} prefill", "calibrated")

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


def _medians(samples: dict[str, dict[int, list[float]]]) -> dict[str, dict[int, float]]:
    return {key: {b: statistics.median(v) for b, v in per.items()} for key, per in samples.items()}
