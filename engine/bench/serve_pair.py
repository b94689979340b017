"""serve-load's server for the known-continuation pair with the modelled drafter
(engine/fixture/known), built in memory, behind `python -m engine serve`'s app, one lever arm a
process: open-loop load on the 4B geometry without 4B weights on disk. The pair has no vocabulary:
prompts are token ids and token i streams as the text " i".

    python -m engine.bench serve-pair --geometry 4b --profile code --arm spec+trim=4 --port 8000
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from collections.abc import Callable, Sequence

import torch

from engine.bench.arms import Arm, parse_arm
from engine.bench.common import add_device_args, resolve_device, setup_logging, torch_dtype
from engine.config import EngineConfig
from engine.engine import Engine
from engine.fixture.known.geometry import GEOMETRIES
from engine.fixture.known.modelled import PROFILE_HELP, AcceptanceProfile, ModelledDrafter, parse_profile
from engine.fixture.known.target import known_pair, known_target
from engine.levers import Levers
from engine.serve.cli import freeze_start_up_heap
from engine.serve.protocol import BadRequest  # the app's refusal: HTTP 400 with this message

log = logging.getLogger(__name__)


class TokenIdText:
    """The text side of a pair without a vocabulary: token i reads " i", so every streamed chunk
    carries text and the text reads back as the ids. Chat has no template to render."""

    eos_token_id = None
    chat_template = "token ids"  # truthy: chat requests reach apply_chat_template, which refuses them

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return "".join(f" {int(i)}" for i in ids)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        try:
            return [int(word) for word in text.split()]
        except ValueError:
            raise ValueError(
                f"text prompt {text[:40]!r}: this pair has no vocabulary; send token ids, or text like ' 12 7 99'"
            ) from None

    def apply_chat_template(self, messages: list[dict], **_: object) -> str:
        raise BadRequest("this bench pair has no vocabulary and no chat template; use /v1/completions with token ids")


def _typed(parse: Callable[[str], object]) -> Callable[[str], object]:
    """An argparse type of `parse`: its ValueError is the option's usage error."""

    def typed(raw: str) -> object:
        try:
            return parse(raw)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    return typed


def known_engine(
    geometry: str,
    profile: AcceptanceProfile,
    arm: Arm,
    device: torch.device,
    *,
    dtype: str = "auto",
    backend: str = "auto",
    cuda_graphs: bool = True,
    max_num_seqs: int = 64,
    max_model_len: int | None = None,
    seed: int = 0,
) -> Engine:
    """An engine of the known pair for one arm (plain: the target alone), every lever explicit so no
    PEGAINFER_SPEC_* variable leaks into an arm; speculative arms get the modelled drafter."""
    weights = torch_dtype(dtype, device)
    if arm.is_plain:
        target, drafter = known_target(geometry, device, weights, seed), None
    else:
        target, drafter = known_pair(geometry, device, weights, seed)
    levers = dataclasses.asdict(Levers()) | arm.levers()
    config = dict(model=target, draft_model=drafter, device=device.type, dtype=dtype, backend=backend)
    config.update(cuda_graphs=cuda_graphs, max_num_seqs=max_num_seqs, max_model_len=max_model_len)
    engine = Engine(EngineConfig(**config, levers=levers, trace=False))
    if drafter is not None:
        ModelledDrafter(engine, profile, seed=seed).install()
    engine.tokenizer = TokenIdText()
    return engine


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine.bench serve-pair", description=__doc__.split("\n\n")[0])
    p.add_argument("--geometry", default="4b", choices=GEOMETRIES, help="4b, or a fixture recipe's shapes")
    p.add_argument("--profile", type=_typed(parse_profile), default="code", help=PROFILE_HELP)
    p.add_argument("--arm", type=_typed(parse_arm), default="spec", help="a lever arm, e.g. spec+trim=4 (arms.py)")
    p.add_argument("--seed", type=int, default=0, help="the weights' and the modelled drafter's seed")
    p.add_argument("--served-model-name", default=None, help="the model id clients send (default: known-GEOMETRY)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="TCP port (0: any free one)")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-model-len", type=int, default=None, help="default: the engine's (KV is sized for it)")
    add_device_args(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    setup_logging(args.verbose)
    if not 0 <= args.port <= 65535 or args.max_num_seqs < 1 or (args.max_model_len or 1) < 1:
        raise SystemExit("--port must be in 0..65535; --max-num-seqs and --max-model-len >= 1")
    try:
        import uvicorn

        from engine.serve.app import build_app
        from engine.serve.worker import EngineWorker
    except ImportError as err:
        raise SystemExit(f"error: serve-pair needs the serve extra ({err}); pip install -e '.[serve]'") from None
    options = dict(dtype=args.dtype, backend=args.backend, cuda_graphs=not args.no_cuda_graphs, seed=args.seed)
    options.update(max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len)
    engine = known_engine(args.geometry, args.profile, args.arm, resolve_device(args.device), **options)
    graphs = engine.capture_graphs()  # as `python -m engine serve` does
    log.info("known-%s pair, arm %s, profile %s: serving; %s", args.geometry, args.arm.label, args.profile.name, graphs)
    freeze_start_up_heap()  # as `python -m engine serve` does
    worker = EngineWorker(engine)
    worker.start()
    try:
        app = build_app(worker, args.served_model_name or f"known-{args.geometry}")
        uvicorn.run(app, host=args.host, port=args.port, log_level="info" if args.verbose else "warning")
    finally:
        worker.stop()
    return 0
