"""python -m engine.bench SUBCOMMAND [options]; each subcommand's --help lists its options."""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = {
    "sweep": ("engine.bench.sweep", "lever arms interleaved under closed-loop load (paired ratios, noise floor)"),
    "serve-load": ("engine.bench.serve_load", "lever arms as servers under open-loop Poisson arrivals (TTFT, ITL)"),
    "serve-pair": (
        "engine.bench.serve_pair",
        "bench-only: serve the known-continuation pair with the modelled drafter (one arm; for serve-load)",
    ),
    "profile": ("engine.bench.profile", "verify/draft forward cost vs rows (batch x span)"),
    "decode": ("engine.bench.decode", "Qwen3-4B-geometry decode vs the HF peer and the measured roofline"),
    "kernels": (
        "engine.bench.kernels",
        "Triton kernels vs cuBLAS and the unfused pairs at the 4B shapes; writes the tuned table",
    ),
    "steps": ("engine.bench.steps", "torch.profiler over engine steps: device-busy vs wall, top kernels and host ops"),
    "preempt": ("engine.bench.preempt", "KV under pressure: preemption by recompute vs whole-budget reservation"),
    "study": (
        "engine.bench.study.run",
        "4B-geometry lever study: known-continuation target, modelled drafter, cost model",
    ),
    "spread": ("engine.bench.spread", "a fixture recipe over builds: τ and the c=1 ratio per seed, same-seed weights"),
    "study-files": (
        "engine.bench.study.files",
        "a study's report from its files (a run cut short after its sweep)",
    ),
    "study-refit": (
        "engine.bench.study.refit",
        "the cost model refit to a finished study's own walls (in-sample: a check of its structure)",
    ),
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
    return importlib.import_module(COMMANDS[argv[0]][0]).main(argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
