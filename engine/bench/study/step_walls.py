"""The study's host and prefill terms (model.py), timed on its own engines in the same run: a prefill
step's wall, and steady steps' mean wall minus their graph replays' device time (the benchmarks
README, "study")."""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from collections.abc import Sequence

from engine.bench.arms import arm_drafts
from engine.bench.report import write_csv
from engine.bench.study.model import StepCosts
from engine.config import SamplingParams
from engine.engine import Engine
from engine.policy.costs import CostTable
from engine.scheduler import Plan
from engine.timing import PhaseTimer, sync

log = logging.getLogger(__name__)


def budget_tokens(steps: int, drafts: int) -> int:
    """max_tokens that keeps a request running `steps` decode-side steps of up to 1 + drafts tokens."""
    return (steps + 1) * (1 + drafts) + 1


def table_context(args: argparse.Namespace) -> int:
    """The KV length the study's cost table is profiled at: the mean over a request's decode steps."""
    return args.prompt_len + args.new_tokens // 2


def centred_warmup(context: int, prompt_len: float, steps: int, least: int) -> int:
    """Untimed one-token steps before `steps` timed ones, so the timed steps' mean KV length is `context`."""
    return max(least, round(context - prompt_len - (steps - 1) / 2))


def timed_steps(
    engine: Engine, prompts: Sequence[Sequence[int]], warmup: int, steps: int, drafts: int
) -> tuple[float, list[tuple[str, int, float]]]:
    """(prefill ms of the steps admitting every prompt, add_request included; [(plan, batch, wall ms)]
    of `steps` steps after `warmup` untimed ones); the requests are aborted, the engine left idle."""
    if engine.has_unfinished():
        raise RuntimeError("calibration needs an idle engine")
    params = SamplingParams(temperature=0, max_tokens=budget_tokens(warmup + steps, drafts), ignore_eos=True)
    sync(engine.device)
    t0 = time.perf_counter()
    ids = [engine.add_request(list(p), params) for p in prompts]
    try:
        admitted = 0
        while admitted < len(prompts):
            engine.step()
            record = engine.timer.records[-1]
            if record.plan != Plan.PREFILL.value:
                break
            admitted += record.batch
        prefill = (time.perf_counter() - t0) * 1e3
        if admitted != len(prompts):
            raise RuntimeError(f"calibration: prefills of {admitted} requests, not of {len(prompts)}")
        walls = []
        for i in range(warmup + steps):
            t0 = time.perf_counter()
            engine.step()
            wall = (time.perf_counter() - t0) * 1e3
            plan = _check(engine, len(prompts))
            if i >= warmup:
                walls.append((plan, len(prompts), wall))
    finally:
        for rid in ids:
            engine.abort(rid)
        while engine.has_unfinished():
            engine.step()
    return prefill, walls


def _check(engine: Engine, batch: int) -> str:
    """The plan of the step just run, which must have been a decode-side step of batch."""
    record = engine.timer.records[-1]
    if record.batch != batch or record.plan == Plan.PREFILL.value:
        raise RuntimeError(f"calibration: {record.plan} of {record.batch} requests, not a decode-side step of {batch}")
    return record.plan


def calibrate(
    engines: dict[str, Engine],
    table: CostTable,
    prompts: Sequence[Sequence[int]],
    batches: Sequence[int],
    spec_drafts: Sequence[int],
    repeats: int = 2,
    steps: int = 16,
    warmup: int = 2,
    context: int | None = None,
) -> list[dict]:
    """Calibration rows (model.py) of the plain decode, the gated round and a round of each of
    spec_drafts at each batch: `repeats` prefills (after an untimed one) and the mean host ms of
    `steps` steps, one-token steps centred on `context` (None: right after `warmup` steps)."""
    if not batches or min(batches) < 1 or max(batches) > len(prompts):
        raise ValueError(f"calibration batches {list(batches)} must be >= 1 and <= {len(prompts)} prompts")
    if repeats < 1 or steps < 1 or warmup < 0:
        raise ValueError(f"calibration needs repeats, steps >= 1 and warmup >= 0 (got {repeats}, {steps}, {warmup})")
    cases = [("plain", 0, 0)]
    if "spec" in engines:
        cases += [("spec", 1, 0)] + [("spec", 0, k) for k in sorted(set(spec_drafts))]
    device_costs, rows = StepCosts(table), []  # no host terms: the table's device ms alone
    for name, gate, drafts in cases:
        engine = engines[name]
        kept = engine.timer
        engine.timer = PhaseTimer(engine.device)
        if name == "spec":
            engine.set_levers(max_batch=gate, max_drafts=drafts)
        try:
            for b in batches:
                timed_steps(engine, prompts[:b], 0, 0, drafts)  # one-time costs of this prefill shape
                lead = warmup
                if context is not None and not drafts:
                    lead = centred_warmup(context, statistics.fmean(map(len, prompts[:b])), steps, warmup)
                for _ in range(repeats):
                    prefill, walls = timed_steps(engine, prompts[:b], lead, steps, drafts)
                    rows.append(_row("prefill", name, Plan.PREFILL.value, b, drafts, prefill, None))
                    plan = walls[0][0]
                    device = device_costs.step_ms(plan, b, engine.runner.graphs.rows(b), drafts)
                    rows.append(_row("host", name, plan, b, drafts, statistics.fmean(w for *_, w in walls), device))
                prefill_ms, host = rows[-2]["wall_ms"], rows[-1]
                log.info(
                    "calibrated %s %s batch %d: prefill %.2f ms, step %.2f ms (host %.2f)",
                    *(name, host["plan"], b, prefill_ms, host["wall_ms"], host["host_ms"]),
                )
        finally:
            engine.timer = kept
            if name == "spec":
                engine.set_levers(max_batch=0, max_drafts=0)
    return rows


def _row(kind: str, engine: str, plan: str, batch: int, drafts: int, wall: float, device: float | None) -> dict:
    """One calibration row; a prefill's wall is its whole cost (no table device time)."""
    host = None if device is None else wall - device
    row = dict(kind=kind, engine=engine, plan=plan, batch=batch, drafts=drafts)
    return row | dict(wall_ms=wall, device_ms=device, host_ms=host)


def add_calibration_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--calib-batches", type=int, nargs="+", help="default: every --concurrency (+ 1 and the largest)")
    p.add_argument("--calib-steps", type=int, default=16, help="timed steps per calibration point (16: a KV block)")
    p.add_argument("--calib-repeats", type=int, default=2, help="timed prefills (and step runs) per point")


def calib_batches(args: argparse.Namespace) -> list[int]:
    """--calib-batches (or every concurrency), with 1 and the largest concurrency."""
    cs = sorted(set(args.concurrency))
    batches = sorted(set(args.calib_batches or cs) | {1, cs[-1]})
    if min(batches) < 1 or max(batches) > cs[-1]:
        raise ValueError(f"--calib-batches {batches}: each must be in 1..{cs[-1]} (the largest --concurrency)")
    if args.calib_steps < 1 or args.calib_repeats < 1:
        raise ValueError("--calib-steps and --calib-repeats must be >= 1")
    return batches


def calibration_stage(
    engines: dict[str, Engine],
    table: CostTable,
    prompts,
    args: argparse.Namespace,
    arms,
    per_round: int,
    prefill_rows: Sequence[dict] = (),
) -> StepCosts:
    """The calibration on the sweep's engines and prompts, at every K an arm verifies, written to
    calibration.csv; the device table and the timed prefills (profile.time_prefills) alone if it fails."""
    spec_drafts = sorted({arm_drafts(a, per_round) for a in arms if not a.is_plain})
    try:
        rows = calibrate(
            *(engines, table, prompts, args.calib_batches, spec_drafts, args.calib_repeats, args.calib_steps),
            warmup=2,
            context=table_context(args),
        )
    except Exception:  # the sweep still runs; its predictions fall back to the device table alone
        log.exception("calibration failed: predictions without host terms, prefill as the timed prefills")
        return table_only(table, prefill_rows)
    write_csv(args.out / "calibration.csv", rows)
    return StepCosts.from_rows(table, rows)


def table_only(table: CostTable, prefill_rows: Sequence[dict]) -> StepCosts:
    """The uncalibrated model: no host time, a prefill of n requests the timed prefill of n prompts (the
    speculative engine's, its drafter context stored: both engines take it)."""
    prefill = {int(r["batch"]): float(r["ms"]) for r in prefill_rows if r["kind"] == "prefill"}
    return StepCosts(table, {}, {"plain": prefill, "spec": prefill})
