"""CLI plumbing shared by the benches: device options, logging, engine sizing, prompt sets."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.engine import Engine
from engine.loader import Checkpoint


def add_device_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "float16", "bfloat16"])
    p.add_argument("--backend", default="auto", choices=["auto", "torch", "triton"])
    p.add_argument("--no-cuda-graphs", action="store_true", help="eager steps (graphs are on by default on CUDA)")
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO from every module")


def add_weight_args(p: argparse.ArgumentParser, drafter_help: str = "the drafter (spec arms need it)") -> None:
    """A target/drafter pair of directories or a fixture recipe, and the prompt set (`weights_of`)."""
    src = p.add_argument_group("weights (a pair of directories, or a fixture recipe built/cached on the device)")
    src.add_argument("--target", type=Path)
    src.add_argument("--drafter", type=Path, help=drafter_help)
    src.add_argument("--recipe", help="fixture recipe (e.g. small): ensure_pair builds or reuses the cached pair")
    p.add_argument("--prompts", type=Path, help="JSONL prompt set (default: the pair's prompts.jsonl)")


def weights_of(args: argparse.Namespace, device) -> tuple[Path, Path | None, Path]:
    if args.recipe:
        if args.target or args.drafter:
            raise SystemExit("give --recipe or --target/--drafter, not both")
        from engine.fixture.cache import ensure_pair

        target, drafter = ensure_pair(args.recipe, device.type)
    elif args.target:
        target, drafter = args.target, args.drafter
    else:
        raise SystemExit("need --target DIR [--drafter DIR] or --recipe NAME")
    prompts = args.prompts or Path(target).parent / "prompts.jsonl"
    if not prompts.is_file():
        raise SystemExit(f"no prompt set: {prompts} does not exist (pass --prompts JSONL)")
    return Path(target), None if drafter is None else Path(drafter), prompts


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("engine.bench").setLevel(logging.INFO)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda but no CUDA device is available")
    return torch.device(name)


def torch_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def make_engine(
    model: str | Path | Checkpoint,
    draft_model: str | Path | Checkpoint | None,
    args: argparse.Namespace,
    device: torch.device,
    *,
    max_num_seqs: int,
    seq_tokens: int,
    headroom: int = 0,
) -> Engine:
    """An engine whose KV is sized for exactly max_num_seqs sequences of seq_tokens (+ the drafter's
    headroom), so two engines fit on one card (the default takes a share of the whole card)."""
    block = 16
    max_model_len = seq_tokens + headroom + 1
    blocks = max_num_seqs * (-(-(seq_tokens + headroom) // block)) + 2  # + the null block, + slack
    weights = [m if m is None or isinstance(m, Checkpoint) else str(m) for m in (model, draft_model)]
    cfg = dict(model=weights[0], draft_model=weights[1], device=device.type, dtype=args.dtype, backend=args.backend)
    cfg.update(cuda_graphs=not args.no_cuda_graphs, max_num_seqs=max_num_seqs, max_model_len=max_model_len)
    cfg.update(max_num_batched_tokens=max(8192, seq_tokens), kv_block_size=block, num_kv_blocks=blocks)
    return Engine(EngineConfig(**cfg, levers={"max_batch": 0, "max_drafts": 0}, trace=False))


def drafter_block(drafter: str | Path) -> int:
    """The drafter's block size: the KV headroom a speculative engine needs past each sequence."""
    from engine.loader import open_checkpoint
    from engine.models.config import DFlashConfig

    return DFlashConfig.from_dict(open_checkpoint(drafter).config).block_size


def load_prompts(path: Path, tokenizer_dir: Path | None, max_len: int | None = None) -> list[list[int]]:
    """Token ids of a JSONL prompt set: each line {"text": ...} (encoded with the target's tokenizer,
    no special tokens) or {"ids": [...]}; max_len keeps the first max_len tokens."""
    lines = [ln for ln in Path(path).read_text().splitlines() if ln.strip()]
    tokenizer = None
    prompts = []
    for n, line in enumerate(lines, 1):
        obj = json.loads(line)
        ids = obj.get("ids", obj.get("token_ids"))
        if ids is None:
            if "text" not in obj:
                raise ValueError(f"{path}:{n}: a prompt needs 'text' or 'ids'")
            if tokenizer is None:
                tokenizer = _tokenizer(tokenizer_dir, path)
            ids = tokenizer.encode(obj["text"], add_special_tokens=False)
        ids = [int(t) for t in ids][:max_len]
        if not ids:
            raise ValueError(f"{path}:{n}: empty prompt")
        prompts.append(ids)
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts


def _tokenizer(directory: Path | None, path: Path):
    if directory is None or not Path(directory).is_dir():
        raise ValueError(f"{path}: text prompts need the target's tokenizer, and the target is not a directory")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory))
