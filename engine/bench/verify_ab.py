"""The verify forward under both dispatches of decode_ab, interleaved: the target's forward over batch x
span rows (runner.verify, a CUDA-graph replay on the GPU, timed as the engine's calibration times it),
so a kernel change's effect on the speculative rounds' verify spans is shown beside its decode A/B.

Used by `python -m engine.bench.decode_ab --verify-batches B ... --verify-spans S ...`: after the
decode runs, each arm's engine takes `max(B)` requests of `--verify-context` cached tokens, then the
points are timed once per arm per repeat, the arms alternating with a rotating start (as the decode
runs). Rows: {arm, repeat, batch, span, rows, ms}; the table: each point's median ms per arm and the
median (min ... max) of the paired ratio before / after (above 1: the current dispatch is faster)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager

from engine.bench.profile import prefill_requests
from engine.bench.report import markdown_table
from engine.engine import Engine
from engine.policy.calibration import time_forwards


def verify_rows(
    engines: Mapping[str, Engine],
    runs: Mapping[str, Callable[[], AbstractContextManager]],
    batches: Sequence[int],
    spans: Sequence[int],
    context: int,
    repeats: int,
    iters: int = 10,
) -> list[dict]:
    """Each arm's verify forward at every (batch, span), `repeats` times, the arms interleaved."""
    reqs = {arm: prefill_requests(engines[arm], max(batches), context, max(spans)) for arm in engines}
    names, rows = list(runs), []
    for rep in range(repeats):
        for arm in names[rep % 2 :] + names[: rep % 2]:
            with runs[arm]():
                points = time_forwards(
                    engines[arm].runner, engines[arm].rounds.accept, reqs[arm], batches, spans, 1, iters
                )
            rows += [
                {"arm": arm, "repeat": rep, **{k: p[k] for k in ("batch", "span", "rows", "ms")}}
                for p in points
                if p["kind"] == "verify"
            ]
    return rows


def verify_markdown(rows: Sequence[dict]) -> str:
    """Per (batch, span): each arm's median ms and the paired before / after ratio over the repeats."""
    table = []
    for batch, span in sorted({(r["batch"], r["span"]) for r in rows}):
        mine = {
            arm: {r["repeat"]: r["ms"] for r in rows if (r["batch"], r["span"], r["arm"]) == (batch, span, arm)}
            for arm in ("before", "after")
        }
        ratios = [mine["before"][rep] / ms for rep, ms in mine["after"].items() if rep in mine["before"]]
        cells = [f"{statistics.median(mine[arm].values()):.3f}" for arm in ("before", "after")]
        ratio = f"{statistics.median(ratios):.3f} ({min(ratios):.3f} … {max(ratios):.3f})"
        table.append([batch, span, batch * span, *cells, ratio])
    header = ["batch", "span", "rows", "before ms", "after ms", "before / after (paired)"]
    return "### Verify forward, both dispatches\n\n" + markdown_table(header, table) + "\n"
