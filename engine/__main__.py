"""CLI: `python -m engine generate --prompt "..."` streams a completion."""

from __future__ import annotations

import argparse
import logging
import sys
import time

from engine.cli_args import add_engine_args, engine_config
from engine.config import SamplingParams, text_error
from engine.serve import cli as serve_cli
from engine.serve.text import Choice
from engine.shipped import shipped_pair


def _parser(prog: str = "python -m engine") -> argparse.ArgumentParser:
    target, drafter = shipped_pair("tiny")
    p = argparse.ArgumentParser(prog=prog, description="pegaspec: Qwen3 + DFlash speculative decoding")
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate one completion and stream it to stdout")
    add_engine_args(
        g, target, f"DFlash drafter dir or hub id (default: none, plain decode; the shipped one: {drafter})"
    )
    g.add_argument("--prompt", required=True, help="prompt text")
    g.add_argument("--max-tokens", type=int, default=64, help="output token budget (default: %(default)s)")
    g.add_argument("--temperature", type=float, default=1.0, help="0: greedy; vLLM's default (default: %(default)s)")
    g.add_argument("--top-k", type=int, default=0, help="0 or -1: off (default: %(default)s)")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus mass kept (default: %(default)s: off)")
    g.add_argument("--seed", type=int, default=None, help="sampling seed (default: from the engine seed)")
    g.add_argument("--ignore-eos", action="store_true", help="keep going past EOS up to --max-tokens")
    g.add_argument("-v", "--verbose", action="store_true", help="log at INFO")
    serve_cli.add_parser(sub, target)
    return p


def _generate(args: argparse.Namespace) -> int:
    from engine.engine import Engine

    if (why := text_error(args.prompt)) is not None:  # e.g. bytes argv could not decode (surrogateescape)
        print(f"error: --prompt is not valid text: {why}", file=sys.stderr)
        return 2
    sampling = ("max_tokens", "temperature", "top_k", "top_p", "seed", "ignore_eos")  # flags named as the fields
    params = SamplingParams(**{name: getattr(args, name) for name in sampling})
    engine = Engine(engine_config(args, max_num_seqs=1))
    if engine.tokenizer is None:
        print("error: this checkpoint has no tokenizer; the CLI takes text prompts", file=sys.stderr)
        return 2
    start = time.perf_counter()
    engine.add_request(args.prompt, params)
    choice, out = Choice(0, engine.tokenizer, params), None  # decoded incrementally; a partial character held
    while engine.has_unfinished():
        for out in engine.step():
            sys.stdout.write(choice.update(out))
            sys.stdout.flush()
    elapsed = time.perf_counter() - start
    sys.stdout.write("\n")
    if out is not None and out.error:
        print(f"error: request rejected: {out.error}", file=sys.stderr)
        return 1
    n = len(out.token_ids) if out else 0
    summary = f"{n} tokens in {elapsed:.2f} s ({n / elapsed:.1f} tok/s), finish_reason={out.finish_reason}"
    if engine.drafter is not None and engine.stats.rounds:
        summary += f", {engine.stats.tokens_per_round:.2f} tokens per verify round"
    print(summary, file=sys.stderr)
    return 0


def main(argv: list[str] | None = None, prog: str = "python -m engine") -> int:
    args = _parser(prog).parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        return args.run(args) if args.command == "serve" else _generate(args)
    except ValueError as err:  # bad knobs, bad config, bad checkpoints: one clear line
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
