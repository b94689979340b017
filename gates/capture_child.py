"""The capture-content child: what gated rounds store as drafter context, by content, and acceptance
after the resume (SPEC 10), against a run that never gated.

    python -m gates.capture_child [--numerics invariant|default]

Per prompt, one request alone on each of two speculative engines over the same weights. The ungated
engine runs it to the end; the gated one runs the same rounds until a round start of the ungated run,
then gated rounds (the gate lever set between steps: MAX_BATCH=1) for at least GATED_ROWS tokens
until it stands on another round start of the ungated run, then speculates again. The outputs are the
same tokens (lossless), so the drafter context rows of the committed tokens must be the same rows:
bit-identical under batch-invariant numerics where they are span-invariant (the Triton backend; the
torch reference path's attention sums each row over its whole span's keys, masked, so its rows differ
in the last bits: there the fp32 tolerance applies), else within TOLERANCE of the row's largest value;
and from the resume on, both runs start their rounds at the same positions with the same context, so
they verify and accept the same drafts (exactly under batch-invariant numerics; in the default ones
the accepted drafts over the resumed rounds within RESUME_SLACK of the ungated run's).

Prints the gated engine's trace and request lines, `[capture]` and `[resume]` lines, and the lossless
lines (the gated output against the ungated engine's target); exits 1 when the run cannot be aligned
or the lossless check fails. The gate's verdict judges the `[capture]` and `[resume]` lines.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from engine import Engine, EngineConfig
from gates.lossless import Tally, check, gate_prompts, greedy, request_line
from gates.weights import resolve_gate_weights

log = logging.getLogger(__name__)

PROMPTS = 3
TOKENS = 48
LEAD_ROUNDS = 2  # speculating rounds before the gate
GATED_ROWS = 12  # at least this many gated rounds (one context row each)
# The largest |difference| of a context row over its largest |value|, by engine dtype: measured on the
# shipped tiny pair on CPU (default numerics, 3 prompts) at 1.6e-6 in fp32 and 0.013 in bf16; a row
# that was never stored (zeros, or a stale row) is off by 1 or more.
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 0.1, torch.float16: 0.1}
RESUME_SLACK = 0.15  # default numerics: accepted drafts over the resumed rounds, relative to the ungated run's


@dataclass
class Run:
    """One request's run: (position, verified, accepted) per speculating round, gated rounds, and the
    drafter context rows of its committed tokens (the latest snapshot before it finished)."""

    rounds: list[tuple[int, int, int]] = field(default_factory=list)
    gated: list[int] = field(default_factory=list)  # positions of its gated rounds
    rows: list[torch.Tensor] = field(default_factory=list)  # per cache tensor: [rows, ...]
    output: list[int] = field(default_factory=list)
    request_id: str = ""


def context_rows(engine: Engine, request_id: str) -> list[torch.Tensor] | None:
    """The drafter context K and V of every layer over the request's stored rows, in position order."""
    req = next((r for r in engine.scheduler.running if r.id == request_id), None)
    if req is None or not req.draft_ready or not req.draft_kv_len:
        return None
    bs = engine.runner.block_size
    slots = torch.tensor([req.blocks[p // bs] * bs + p % bs for p in range(req.draft_kv_len)])
    return [cache.flatten(0, 1)[slots.to(cache.device)].float().cpu() for kv in engine.runner.draft_kv for cache in kv]


def _counters(engine: Engine) -> tuple[int, int, int, int]:
    s = engine.stats
    return s.gated_rounds, s.draft_tokens_verified, s.draft_tokens_accepted, s.rounds


def run_one(engine: Engine, ids: list[int], gate_at: int | None = None, resume_at: Sequence[int] = ()) -> Run:
    """Step one request to its end; with gate_at, gate from that output length on, and speculate again
    at the first length in resume_at at least GATED_ROWS later."""
    run = Run(request_id=engine.add_request(ids, greedy(TOKENS)))
    done = False
    while not done:
        req = next((r for r in engine.scheduler.running if r.id == run.request_id), None)
        at = len(req.output_ids) if req is not None else 0
        if gate_at is not None and at == gate_at and not run.gated:
            engine.set_levers(max_batch=1)
        elif engine.levers.max_batch and at in resume_at and at - run.gated[0] >= GATED_ROWS:
            engine.set_levers(max_batch=0)
        before = _counters(engine)
        out = next(o for o in engine.step() if o.request_id == run.request_id)
        done = out.finished
        gated, verified, accepted, rounds = (now - was for now, was in zip(_counters(engine), before, strict=True))
        if gated:
            run.gated.append(at)
        elif rounds:
            run.rounds.append((at, verified, accepted))
        rows = None if done else context_rows(engine, run.request_id)
        if rows is not None:
            run.rows = rows
        run.output = out.token_ids
    return run


def compare_rows(a: Run, b: Run, prompt_len: int, tolerance: float) -> tuple[int, int, int, float]:
    """(rows compared, of them stored by gated rounds, rows that differ (any bit when tolerance is 0,
    else by more than it), the largest difference relative to the row's largest value)."""
    n = min(a.rows[0].shape[0], b.rows[0].shape[0])
    diff, equal = torch.zeros(n), torch.ones(n, dtype=torch.bool)
    for x, y in zip(a.rows, b.rows, strict=True):
        x, y = x[:n].flatten(1), y[:n].flatten(1)
        diff = torch.maximum(diff, (x - y).abs().amax(1) / y.abs().amax(1).clamp_min(1e-30))
        equal &= (x == y).all(1)
    bad = int((~equal).sum()) if tolerance == 0 else int((diff > tolerance).sum())
    # A gated round at output length L stores the row of output token L - 1 (position prompt + L - 1).
    gated = sum(1 for at in a.gated if prompt_len + at - 1 < n)
    return n, gated, bad, float(diff.max()) if n else 0.0


def resumed_rounds(a: Run, b: Run) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]:
    """The gated run's rounds after its resume, and the ungated run's from the same position on."""
    resume = a.gated[-1] + 1
    mine = [r for r in a.rounds if r[0] >= resume]
    theirs = [r for r in b.rounds if r[0] >= resume]
    n = min(len(mine), len(theirs))
    return mine[:n], theirs[:n]


def resume_counts(a: Sequence[tuple[int, int, int]], b: Sequence[tuple[int, int, int]]) -> tuple[int, ...]:
    """The [resume] counts of aligned rounds: rounds, accepted (gated run, ungated run), verified (the
    same), and rounds whose (position, verified, accepted) differ."""
    return (
        len(a),
        sum(r[2] for r in a),
        sum(r[2] for r in b),
        sum(r[1] for r in a),
        sum(r[1] for r in b),
        sum(x != y for x, y in zip(a, b, strict=True)),
    )


def _engines(weights, exact: bool) -> tuple[Engine, Engine]:
    """(ungated, gated): the same pair and levers; only the gated one writes the trace."""
    common = dict(model=weights.target, draft_model=weights.drafter, batch_invariant=exact, max_num_seqs=2)
    levers = {"max_batch": 0, "max_drafts": 0, "policy": "static"}
    return Engine(EngineConfig(**common, levers=levers, trace=False)), Engine(EngineConfig(**common, levers=levers))


def run(numerics: str) -> int:
    weights, reason = resolve_gate_weights()
    if weights is None:
        log.error("no gate weights: %s", reason)
        return 1
    exact = numerics == "invariant"
    still, gated = _engines(weights, exact)
    tolerance = 0.0 if exact else TOLERANCE[gated.dtype]  # batch-invariant rows are span-invariant
    tally = Tally()
    rows = [0, 0, 0]  # compared, gated, mismatched
    worst = 0.0
    resumed = [0] * 6  # rounds, accepted, reference accepted, verified, reference verified, mismatched rounds
    for prompt in gate_prompts(weights.label, PROMPTS):
        ids = list(still.tokenizer.encode(prompt, add_special_tokens=False))
        ref = run_one(still, ids)
        starts = [r[0] for r in ref.rounds]
        if len(starts) <= LEAD_ROUNDS:
            log.error("the ungated run of %d tokens ran only %d speculating rounds", TOKENS, len(starts))
            return 1
        mine = run_one(gated, ids, gate_at=starts[LEAD_ROUNDS], resume_at=starts)
        print(request_line(mine.request_id, len(ids), len(mine.output), TOKENS))
        check(still, ids, ref.output, mine.output, tally, exact, TOKENS, request=mine.request_id)
        if len(mine.gated) < GATED_ROWS or not mine.rows:
            log.error(
                "%s: %d gated rounds (the run never reached the gate where the ungated one started a round)",
                mine.request_id,
                len(mine.gated),
            )
            return 1
        n, g, bad, diff = compare_rows(mine, ref, len(ids), tolerance)
        rows, worst = [rows[0] + n, rows[1] + g, rows[2] + bad], max(worst, diff)
        counts = resume_counts(*resumed_rounds(mine, ref))
        resumed = [x + y for x, y in zip(resumed, counts, strict=True)]
    print(
        f"[capture] numerics={numerics} bit_identical={int(exact)} requests={tally.requests} "
        f"compared_rows={rows[0]} gated_rows={rows[1]} mismatched_rows={rows[2]} max_diff={worst:.6g} "
        f"tolerance={tolerance:g}"
    )
    names = ("rounds", "accepted", "reference_accepted", "verified", "reference_verified", "mismatched_rounds")
    fields = " ".join(f"{k}={v}" for k, v in zip(names, resumed, strict=True))
    print(f"[resume] numerics={numerics} requests={tally.requests} {fields}")
    tally.report(f"capture_content_{numerics}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gates.capture_child", description=__doc__.split("\n\n")[0])
    p.add_argument("--numerics", choices=("invariant", "default"), default="invariant")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return run(args.numerics)
    except AssertionError as err:
        log.error("the lossless check failed: %s", err)
        return 1


if __name__ == "__main__":
    sys.exit(main())
