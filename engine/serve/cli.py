"""`python -m engine serve`: flags, then the engine, its loop thread and uvicorn."""

from __future__ import annotations

import argparse
import gc
import logging
from functools import partial
from pathlib import Path

from engine import knobs
from engine.cli_args import add_engine_args, engine_config, flag_type

log = logging.getLogger(__name__)


def _port(raw: str) -> int:
    port = flag_type("--port", knobs.parse_count)(raw)
    if port > 65535:
        raise argparse.ArgumentTypeError(f"--port={raw!r} is not a TCP port (0..65535)")
    return port


def add_parser(sub: argparse._SubParsersAction, default_model: Path) -> argparse.ArgumentParser:
    """The `serve` subcommand: generate's engine and lever flags plus the server's own."""
    s = sub.add_parser("serve", help="serve the OpenAI-compatible HTTP API (completions, chat, metrics)")
    add_engine_args(s, default_model, "DFlash drafter dir or hub id (default: none, plain decode)")
    s.add_argument("--served-model-name", default=None, help="the model id clients send (default: --model's name)")
    s.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    s.add_argument("--port", type=_port, default=8000, help="TCP port (0: any free one; default: %(default)s)")
    count = partial(flag_type, parse=knobs.parse_count)
    s.add_argument(
        "--max-num-seqs", type=count("--max-num-seqs"), default=64, help="most requests running (default: %(default)s)"
    )
    s.add_argument(
        "--max-model-len", type=count("--max-model-len"), default=None, help="context limit (default: min(model, 4096))"
    )
    s.add_argument("-v", "--verbose", action="store_true", help="log at INFO")
    s.set_defaults(run=run)
    return s


def freeze_start_up_heap() -> None:
    """The start-up heap (torch, the models, the graphs) leaves the cyclic collector's reach, as vLLM
    does: a full collection over it stops the engine loop for ~0.5 s on a CI core."""
    gc.collect()
    gc.freeze()


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from engine.serve.app import build_app
    except ImportError as err:
        raise SystemExit(f"error: `serve` needs the serve extra ({err}); pip install -e '.[serve]'") from None
    from engine.engine import Engine
    from engine.serve.worker import EngineWorker

    engine = Engine(engine_config(args, max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len))
    engine.capture_graphs()  # before serving: no graph captured mid-request
    freeze_start_up_heap()
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
