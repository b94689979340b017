"""`python -m engine serve`: flags, then the engine, its loop thread and uvicorn."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from pathlib import Path

from engine import knobs

log = logging.getLogger(__name__)

# Lever flags: (flag, the env knob it overrides, EngineConfig field, the knob's parser). Parsed by the
# knob parsers, so a flag refuses exactly the values its variable refuses.
LEVER_FLAGS: tuple[tuple[str, str, str, Callable], ...] = (
    ("--max-batch", "PEGAINFER_SPEC_MAX_BATCH", "spec_max_batch", knobs.parse_count),
    ("--max-drafts", "PEGAINFER_SPEC_MAX_DRAFTS", "spec_max_drafts", knobs.parse_count),
    ("--hedge", "PEGAINFER_SPEC_HEDGE", "spec_hedge", knobs.parse_count),
    ("--hedge-positions", "PEGAINFER_SPEC_HEDGE_POSITIONS", "spec_hedge_positions", knobs.parse_counts),
    ("--hedge-auto", "PEGAINFER_SPEC_HEDGE_AUTO", "spec_hedge_auto", knobs.parse_flag),
    ("--hedge-knee", "PEGAINFER_SPEC_HEDGE_KNEE", "spec_hedge_knee", knobs.parse_count),
)


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


def add_parser(sub: argparse._SubParsersAction, default_model: Path) -> argparse.ArgumentParser:
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
    for flag, env, _, parse in LEVER_FLAGS:
        s.add_argument(flag, type=knob_type(flag, parse), default=None, help=f"default: {env}")
    s.add_argument("-v", "--verbose", action="store_true", help="log at INFO")
    s.set_defaults(run=run)
    return s


def engine_config(args: argparse.Namespace):
    from engine.config import EngineConfig

    levers = {field: getattr(args, flag[2:].replace("-", "_")) for flag, _, field, _ in LEVER_FLAGS}
    return EngineConfig(
        model=args.model,
        draft_model=args.draft_model,
        device=args.device,
        dtype=args.dtype,
        backend=args.backend,
        cuda_graphs=not args.no_cuda_graphs,
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len,
        **levers,
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
