"""python -m engine.bench SUBCOMMAND [options]; each subcommand's --help lists its options."""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module under engine.bench, the question it answers)
COMMANDS = {
    "decode": ("decode", "How close is plain decode to the roofline, and to HF transformers, at the Qwen3-4B shapes?"),
    "profile": ("profile", "Up to how many verify rows (batch x span) is a target forward nearly free?"),
    "sweep": ("sweep", "Which lever arm wins at each concurrency under closed-loop load, by more than the noise?"),
    "steps": ("steps", "Where does a step's time go: device work, which kernels, which host ops?"),
    "serve-load": ("serve_load", "Which lever arm serves best under open-loop Poisson arrivals (tok/s, TTFT, ITL)?"),
    "serve-pair": ("serve_pair", "(for serve-load) The known-continuation 4B pair served with the modelled drafter."),
    "preempt": ("preempt", "Under KV pressure, preemption by recompute or whole-budget reservation: which is faster?"),
    "kernels": ("kernels", "Which config is fastest per projection and row count (the tuned table), and by how much?"),
    "study": ("study.run", "Which lever wins where on the 4B geometry, and does the cost model predict it?"),
    "study-files": ("study.files", "What does a study's report say, rebuilt from its files (a run cut short)?"),
    "study-refit": ("study.refit", "Refit to a study's own walls, does the cost model's structure meet the bar?"),
    "tau-context": ("tau_context", "How fast does a pair's τ fall as its prompt context grows (held-out code)?"),
    "spread": ("spread", "How far do τ and the c=1 ratio spread over builds of a recipe; same seed, same weights?"),
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine.bench", description="pegaspec benchmarks")
    sub = p.add_subparsers(dest="command", required=True, metavar="{" + ",".join(COMMANDS) + "}")
    for name, (_, doc) in COMMANDS.items():
        sub.add_parser(name, help=doc, add_help=False)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in COMMANDS:
        _parser().parse_args(argv[:1])  # argparse prints the help or the usage error and exits
    return importlib.import_module(f"engine.bench.{COMMANDS[argv[0]][0]}").main(argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
