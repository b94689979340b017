"""What one engine step costs end to end, for the closed-loop replay (engine/bench/costsim.py): the
device table (engine/costs.py CostTable: graph replays) plus the two terms it does not see, both
calibrated on the same engines in the same run (engine/bench/calibrate.py):

- host time per step, per plan (plain decode, gated round, speculative round) and batch: the wall of
  `engine.step()` minus the device time of its graph replays (see calibrate.py for why), the median
  per calibrated batch and linear between them (it also absorbs where a step's graphs differ from
  the table's at that batch, e.g. the plain decode graph against the profiled span-1 verify); a
  speculative round's also per calibrated drafts K and linear in K between them (at batch 256 on the
  H200 4B study the term was +1.6 ms at K = 2 and -1.8 ms at K = 15, where the table's span-16 verify
  runs slow: their median, -0.3 ms, made every trim 11-18 % too fast there);
- the wall of a prefill step admitting n requests (a graph replay up to 2,048 tokens, engine/prefill.py;
  eager and compute-bound above; the table holds no prefill row), per
  engine (the speculative engine's prefill also stores the drafter's context).

Calibration rows (calibration.csv): {kind, engine, plan, batch, drafts, wall_ms, device_ms, host_ms}:
kind `host` (the median wall of steady steps of `batch` requests, `drafts` per round, and host_ms =
wall_ms - device_ms) or `prefill` (the wall of one prefill step admitting `batch` requests).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field

from engine.policy.costs import CostTable, interpolate
from engine.scheduler import Plan

HOST_PLANS = (Plan.DECODE.value, Plan.GATED.value, Plan.SPECULATIVE.value)
ENGINES = ("plain", "spec")


@dataclass
class StepCosts:
    """The table's device ms plus host[plan][batch] per step and prefill[engine][n] per prefill step."""

    table: CostTable
    host: dict[str, dict[int, float]] = field(default_factory=dict)
    prefill: dict[str, dict[int, float]] = field(default_factory=dict)
    spec_host: dict[int, dict[int, float]] = field(default_factory=dict)  # drafts -> batch -> ms

    @classmethod
    def from_rows(cls, table: CostTable, rows: Iterable[dict]) -> StepCosts:
        """From calibration rows (dicts or CSV rows of strings): the median host ms per (plan, batch)
        and the median prefill wall per (engine, batch)."""
        host: dict[str, dict[int, list[float]]] = {}
        prefill: dict[str, dict[int, list[float]]] = {}
        spec_host: dict[int, dict[int, list[float]]] = {}
        for r in rows:
            kind, engine, batch = r["kind"], r["engine"], int(r["batch"])
            if kind == "host":
                if r["plan"] not in HOST_PLANS:
                    raise ValueError(f"calibration row {r}: plan must be one of {HOST_PLANS}")
                host.setdefault(r["plan"], {}).setdefault(batch, []).append(float(r["host_ms"]))
                if r["plan"] == Plan.SPECULATIVE.value and int(r.get("drafts") or 0) > 0:
                    spec_host.setdefault(int(r["drafts"]), {}).setdefault(batch, []).append(float(r["host_ms"]))
            elif kind == "prefill":
                if engine not in ENGINES:
                    raise ValueError(f"calibration row {r}: engine must be one of {ENGINES}")
                wall = float(r["wall_ms"])
                if wall <= 0:
                    raise ValueError(f"calibration row {r}: wall_ms must be > 0")
                prefill.setdefault(engine, {}).setdefault(batch, []).append(wall)
            else:
                raise ValueError(f"calibration row {r}: unknown kind {kind!r} (host or prefill)")
        return cls(table, _medians(host), _medians(prefill), _medians(spec_host))

    def host_ms(self, plan: str, batch: int, drafts: int = 0) -> float:
        """0 for an uncalibrated plan. It may be negative: where the step's graphs run faster than
        the table's proxy for them, the residual corrects the table. A speculative round of `drafts`
        takes the per-K terms where they were calibrated (linear in K, the nearest K outside them)."""
        if plan == Plan.SPECULATIVE.value and drafts and self.spec_host:
            ks = sorted(self.spec_host)
            at = {k: interpolate(self.spec_host[k], batch, f"{plan} K={k} host", "calibrated") for k in ks}
            k = min(max(drafts, ks[0]), ks[-1])
            return interpolate(at, k, f"{plan} host", "calibrated")
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
        return device + self.host_ms(plan, batch, drafts)


def _medians(samples: dict[str, dict[int, list[float]]]) -> dict[str, dict[int, float]]:
    return {key: {b: statistics.median(v) for b, v in per.items()} for key, per in samples.items()}
