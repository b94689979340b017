"""The adaptive policy's host cost per round inside an engine run, split by where it runs: on the round's
critical path (a decision in turn, a plan applied, an outcome observed in turn, the gated relaxation,
the host term's update) or while the device runs the round (engine/policy_ahead.py: the last outcome
observed and the next round planned once the round is launched). `engine.bench policy-cost` times the
same calls in a tight loop, where the policy's code and data stay hot; between two rounds of an
engine the forwards evict them.

    python -m engine.bench policy-cost-engine --pair engine/fixture/data/tiny --concurrency 1 16 [--in-turn]

The engine serves the pair's prompts (two waves of `c`, `--new-tokens` each) on a cost table where
speculation pays at every batch (policy_cost.synthetic_table), after a warm-up wave. Per concurrency:
speculative and gated rounds, and the policy's µs a round on the critical path and in the device's
window (on a CPU device the forward runs on the host, so the window overlaps nothing there).
`--in-turn`: speculative rounds plan nothing ahead, so each decides and observes on its critical path
(the engine before `ec7d09e`).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from engine import Engine, EngineConfig, SamplingParams
from engine.bench.common import setup_logging
from engine.bench.policy_cost import synthetic_table
from engine.bench.report import markdown_table, write_csv
from engine.policy.ahead import PolicyAhead
from engine.policy.span import SpanPolicy

log = logging.getLogger(__name__)
CRITICAL = ("decide", "apply", "observe", "observe_wall", "gated")  # SpanPolicy's, when called in turn
WINDOW = ("after_verify", "after_gated")  # PolicyAhead's, after a round's launch


class Clock:
    """Seconds spent in the outermost timed call, by where it ran."""

    def __init__(self) -> None:
        self.critical = self.window = 0.0
        self._depth = 0

    def wrap(self, fn: Callable, window: bool) -> Callable:
        def timed(*args, **kwargs):
            if self._depth:
                return fn(*args, **kwargs)
            self._depth += 1
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.perf_counter() - start
                self._depth -= 1
                if window:
                    self.window += spent
                else:
                    self.critical += spent

        return timed


@contextmanager
def timed_policy(clock: Clock, in_turn: bool) -> Iterator[None]:
    saved = [(SpanPolicy, n, getattr(SpanPolicy, n)) for n in CRITICAL]
    saved += [(PolicyAhead, n, getattr(PolicyAhead, n)) for n in WINDOW]
    try:
        for owner, name, fn in saved:
            setattr(owner, name, clock.wrap(fn, owner is PolicyAhead))
        if in_turn:
            PolicyAhead.after_verify = lambda *args: None
        yield
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)


def measure(pair: Path, device: str, c: int, new_tokens: int, prompts: Sequence[str], in_turn: bool) -> dict:
    config = EngineConfig(
        model=str(pair / "target"),
        draft_model=str(pair / "drafter"),
        device=device,
        max_num_seqs=c,
    )
    engine = Engine(config)  # static first: the synthetic table replaces a calibration, host term learnt
    engine.set_cost_table(synthetic_table(engine.drafts_per_round))
    engine.set_levers(policy="adaptive")
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    engine.generate(list(prompts[:c]), params)  # warm-up: compiles, graphs
    clock = Clock()
    chosen = engine.rounds.policy.chosen.copy()
    with timed_policy(clock, in_turn):
        engine.generate(list(prompts[: 2 * c]), params)
    rounds = engine.rounds.policy.chosen - chosen
    n = rounds.total()
    return {
        "concurrency": c,
        "in_turn": int(in_turn),
        "rounds": n,
        "gated_rounds": rounds[0],
        "critical_us": 1e6 * clock.critical / n,
        "window_us": 1e6 * clock.window / n,
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine.bench policy-cost-engine", description=__doc__.split("\n")[0])
    p.add_argument("--pair", type=Path, default=Path("engine/fixture/data/tiny"), help="a fixture pair's folder")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--device", default="cpu")
    p.add_argument("--in-turn", action="store_true", help="speculative rounds decide and observe in turn")
    p.add_argument("--out", type=Path, default=None, help="CSV, one row per concurrency")
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    setup_logging(args.verbose)
    if min(args.concurrency) < 1 or args.new_tokens < 2:
        raise SystemExit("--concurrency must be >= 1 and --new-tokens >= 2")
    with (args.pair / "prompts.jsonl").open() as f:
        prompts = [json.loads(line)["text"] for line in f]
    if 2 * max(args.concurrency) > len(prompts):
        raise SystemExit(f"{args.pair}: {len(prompts)} prompts, {2 * max(args.concurrency)} needed")
    rows = [measure(args.pair, args.device, c, args.new_tokens, prompts, args.in_turn) for c in args.concurrency]
    keys = ["concurrency", "in_turn", "rounds", "gated_rounds", "critical_us", "window_us"]
    print(markdown_table(keys, [[f"{r[k]:.1f}" if k.endswith("_us") else r[k] for k in keys] for r in rows]))
    if args.out:
        write_csv(args.out, rows)
    return 0
