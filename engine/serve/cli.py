"""`python -m engine serve`: flags, then the engine, its loop thread and uvicorn."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from pathlib import Path

from engine import knobs
from engine.levers import lever_names

log = logging.getLogger(__name__)


def knob_type(flag: str, parse: Callable) -> Callable[[str], object]:
    """An argparse type that parses like the env knob and shows the knob parser's message."""

    def convert(raw: str) -> object:
        try:
            return parse(flag, raw)
        except knobs.KnobError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    convert.__name__ = parse.__name__
    return convert


def _port(raw: str) -> int:
    port = knob_type("--port", knobs.parse_count)(raw)
    if port > 65535:
        raise argparse.ArgumentTypeError(f"--port={raw!r} is not a TCP port (0..65535)")
    return port


def add_parser(
    sub: argparse._SubParsersAction, default_model: Path, add_lever_flags: Callable[[argparse.ArgumentParser], None]
) -> argparse.ArgumentParser:
    """The `serve` subcommand; `add_lever_flags` adds the lever flags (the same as generate's, parsed
    by the knob parser, so a flag refuses exactly what its PEGAINFER_SPEC_* variable refuses)."""
    s = sub.add_parser("serve", help="serve the OpenAI-compatible HTTP API (completions, chat, metrics)")
    s.add_argument("--model", default=str(default_model), help="target checkpoint dir or hub id")
    s.add_argument("--draft-model", default=None, help="DFlash drafter dir or hub id (none: plain decode)")
    s.add_argument("--served-model-name", default=None, help="the model id clients send (default: --model's name)")
    s.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    s.add_argument("--port", type=_port, default=8000, help="TCP port (0: any free one)")
    s.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    s.add_argument("--dtype", default="auto", choices=["auto", "float32", "float16", "bfloat16"])
    s.add_argument("--backend", default="auto", choices=["auto", "torch", "triton"])
    s.add_argument("--no-cuda-graphs", action="store_true")
    s.add_argument("--max-num-seqs", type=knob_type("--max-num-seqs", knobs.parse_count), default=64)
    s.add_argument("--max-model-len", type=knob_type("--max-model-len", knobs.parse_count), default=None)
    add_lever_flags(s)
    s.add_argument("-v", "--verbose", action="store_true", help="log at INFO")
    s.set_defaults(run=run)
    return s


def engine_config(args: argparse.Namespace):
    from engine.config import EngineConfig

    levers = {name: getattr(args, name) for name in lever_names() if getattr(args, name) is not None}
    return EngineConfig(
        model=args.model,
        draft_model=args.draft_model,
        device=args.device,
        dtype=args.dtype,
        backend=args.backend,
        cuda_graphs=not args.no_cuda_graphs,
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len,
        levers=levers,
    )


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from engine.serve.app import build_app
    except ImportError as err:
        raise SystemExit(f"error: `serve` needs the serve extra ({err}); pip install -e '.[serve]'") from None
    from engine.engine import Engine
    from engine.serve.worker import EngineWorker

    engine = Engine(engine_config(args))
    worker = EngineWorker(engine)
    name = args.served_model_name or Path(args.model).name
    worker.start()
    try:
        uvicorn.run(
            build_app(worker, name), host=args.host, port=args.port, log_level="info" if args.verbose else "warning"
        )
    finally:
        worker.stop()
    return 0
