"""The flags `generate` and `serve` share: weights, device, backend, graphs and one flag per lever,
each lever parsed like its environment variable (so a flag refuses what PEGAINFER_SPEC_* refuses)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from functools import partial
from pathlib import Path

from engine.config import BACKENDS, DEVICES, DTYPES, EngineConfig
from engine.knobs import parse_count, parse_lever
from engine.levers import env_name, lever_doc, lever_names


def flag_type(flag: str, parse: Callable[[str, str], object]) -> Callable[[str], object]:
    """An argparse type that parses like the env knob (parse(label, raw)) and shows its message."""

    def convert(raw: str) -> object:
        try:
            return parse(flag, raw)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    convert.__name__ = getattr(parse, "__name__", flag)
    return convert


def add_engine_args(parser: argparse.ArgumentParser, default_model: Path, drafter_help: str) -> None:
    parser.add_argument(
        "--model", default=str(default_model), help="target checkpoint dir or hub id (default: %(default)s)"
    )
    parser.add_argument("--draft-model", default=None, help=drafter_help)
    parser.add_argument("--device", default="auto", choices=DEVICES, help="auto: cuda when available")
    parser.add_argument("--dtype", default="auto", choices=DTYPES, help="auto: bfloat16 on cuda, float32 on cpu")
    parser.add_argument("--backend", default="auto", choices=BACKENDS, help="auto: triton on cuda, torch on cpu")
    parser.add_argument("--no-cuda-graphs", action="store_true", help="run every step eagerly (no graph capture)")
    window = flag_type("--draft-window", parse_count)
    parser.add_argument("--draft-window", type=window, default=0, help="the drafter's last N context rows (0: all)")
    for name in lever_names():
        flag = "--" + name.replace("_", "-")
        parse = flag_type(flag, partial(_lever, name))
        parser.add_argument(flag, type=parse, default=None, help=f"{lever_doc(name)} (default: ${env_name(name)})")


def _lever(name: str, flag: str, raw: str) -> object:
    return parse_lever(name, raw, label=flag)


def engine_config(args: argparse.Namespace, **fields: object) -> EngineConfig:
    """EngineConfig from the shared flags; lever flags not given are left to the environment."""
    levers = {name: getattr(args, name) for name in lever_names() if getattr(args, name) is not None}
    return EngineConfig(
        model=args.model,
        draft_model=args.draft_model,
        device=args.device,
        dtype=args.dtype,
        backend=args.backend,
        cuda_graphs=not args.no_cuda_graphs,
        draft_window=args.draft_window,
        levers=levers,
        **fields,
    )
