"""The study's cost model of one engine step: the device table (CostTable: graph replays) plus the host
ms per (plan, batch[, K]) and the prefill wall per (engine, n), calibrated in the same run
(step_walls.py); and the tokens a round commits under per-position acceptance.

calibration.csv rows: {kind (host | prefill), engine, plan, batch, drafts, wall_ms, device_ms, host_ms}."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
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


def committed_pmf(conditional: Sequence[float], drafts: int) -> list[float]:
    """pmf[n] = P(exactly n of `drafts` drafts accepted), n = 0..drafts."""
    pmf, p = [], 1.0
    for a in conditional[:drafts]:
        pmf.append(p * (1.0 - a))
        p *= a
    return [*pmf, p]


def truncated_tau(conditional: Sequence[float], drafts: int, tokens: int) -> float:
    """Committed tokens per round over a request of `tokens` tokens whose rounds accept at most the
    tokens left minus the bonus (the engine's draft limit): tokens / E[rounds], by dynamic programming."""
    if tokens < 1:
        raise ValueError(f"tokens={tokens}: must be >= 1")
    pmf = committed_pmf(conditional, drafts)
    rounds = [0.0] * (tokens + 1)
    for left in range(1, tokens + 1):
        cap = max(0, min(drafts, left - 1))
        rounds[left] = 1.0 + sum(p * rounds[left - 1 - min(n, cap)] for n, p in enumerate(pmf))
    return tokens / rounds[tokens]
