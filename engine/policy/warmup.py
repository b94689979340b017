"""The CUDA graphs an adaptive engine's rounds replay, captured before it serves (SPEC 9: K comes from
the graph-backed span variants).

A static engine replays one verify span and one drafter forward per batch bucket, and captures each
the first time a batch reaches that bucket. The adaptive policy moves between the gated round (the
decode graph), every span variant and the drafter at every bucket a wave drains through, so captured
lazily its graphs land inside serving rounds: on the H200 the small pair's adaptive arm spent twice
the spec arm's target time in the rounds that captured (`d429459`, 15 % slower over the sweep with
96 % of its rounds at the same K). So once the policy is in force, every (bucket, variant) graph up
to the batch the KV pool admits is captured here, on the calibration's dummy requests.
"""

from __future__ import annotations

import logging
import time

from engine.policy.calibration import EngineView, dummy_requests, plan_calibration

log = logging.getLogger(__name__)


def capture_policy_graphs(engine: EngineView) -> int:
    """Capture the decode, drafter and verify graphs (every policy span but 1: the gated round runs
    the decode graph) at every graph bucket the idle engine's KV pool admits, once; the number
    captured (0 without graphs, on a busy engine: a later idle call captures them, or once done; the
    calibration captured the buckets it timed)."""
    runner = engine.runner
    if not runner.graphs.enabled or runner.graphs.policy_captured or engine.scheduler.has_work():
        return 0
    how = plan_calibration(engine)  # the batches stop where the KV pool does
    buckets = [b for b in runner.graphs.buckets if b <= max(how.batches)]
    before, start = runner.graphs.captures, time.perf_counter()
    with dummy_requests(engine, max(buckets), how.context, max(how.spans)) as reqs:
        for b in buckets:
            sub = reqs[:b]
            runner.stage(sub)
            runner.decode(sub)
            runner.stage(sub)
            drafts = runner.draft(sub)  # the verify graphs take the draft graph's buffer, as rounds do
            for k in (span - 1 for span in how.spans if span > 1):
                runner.stage(sub, [k] * b)
                runner.verify(sub, drafts, k, engine.rounds.accept)
    runner.graphs.policy_captured = True
    captured = runner.graphs.captures - before
    log.info(
        "policy graphs: %d captured over %d buckets in %.2f s", captured, len(buckets), time.perf_counter() - start
    )
    return captured
