"""The `pegaspec` console script: one entry point for every command-line tool."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from inspect import signature

# command -> (module whose main(argv) runs it, whether main wants the command name itself, help)
COMMANDS = {
    "generate": ("engine.__main__", True, "generate one completion and stream it (python -m engine generate)"),
    "serve": ("engine.__main__", True, "the OpenAI-compatible HTTP server (python -m engine serve)"),
    "bench": ("engine.bench.__main__", False, "benchmarks: sweep, serve-load, profile, decode, steps"),
    "fixture": ("engine.fixture.__main__", False, "build or evaluate the shipped fixture pairs"),
    "trace": ("trace_tools.cli", False, "read round traces and gate result lines (python -m trace_tools)"),
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        p = argparse.ArgumentParser(prog="pegaspec", description="pegaspec: Qwen3 + DFlash speculative decoding")
        sub = p.add_subparsers(dest="command", required=True, metavar="{" + ",".join(COMMANDS) + "}")
        for name, (_, _, doc) in COMMANDS.items():
            sub.add_parser(name, help=doc, add_help=False)
        p.parse_args(argv[:1])  # prints the help or the usage error and exits
    module, keeps_name, _ = COMMANDS[argv[0]]
    run = importlib.import_module(module).main
    # A tool whose main takes `prog` prints its usage under this script's name (`pegaspec generate`).
    named = {"prog": "pegaspec" if keeps_name else f"pegaspec {argv[0]}"} if "prog" in signature(run).parameters else {}
    return run(argv if keeps_name else argv[1:], **named)


if __name__ == "__main__":
    raise SystemExit(main())
