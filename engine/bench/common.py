"""CLI plumbing shared by the benches: device options, logging, engine sizing, prompt sets."""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Sequence
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.engine import Engine
from engine.kv_cache import kv_bytes_per_block
from engine.loader import Checkpoint, open_checkpoint
from engine.memory import kv_budget
from engine.models.config import DFlashConfig, Geometry

BLOCK = 16  # KV block size of every bench engine


def add_device_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "float16", "bfloat16"])
    p.add_argument("--backend", default="auto", choices=["auto", "torch", "triton"])
    p.add_argument("--no-cuda-graphs", action="store_true", help="eager steps (graphs are on by default on CUDA)")
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO from every module")
    help = "the share of the card the bench's engines (weights, KV pool, activations) may hold, as the engine's"
    p.add_argument("--gpu-memory-utilization", type=_share, default=EngineConfig.gpu_memory_utilization, help=help)


def add_weight_args(p: argparse.ArgumentParser, drafter_help: str = "the drafter (spec arms need it)") -> None:
    """A target/drafter pair of directories or a fixture recipe, and the prompt set (`weights_of`)."""
    src = p.add_argument_group("weights (a pair of directories, or a fixture recipe built/cached on the device)")
    src.add_argument("--target", type=Path)
    src.add_argument("--drafter", type=Path, help=drafter_help)
    src.add_argument("--recipe", help="fixture recipe (e.g. small): ensure_pair builds or reuses the cached pair")
    p.add_argument("--prompts", type=Path, help="JSONL prompt set (default: the pair's prompts.jsonl)")


def weights_of(args: argparse.Namespace, device, arms: Sequence = ()) -> tuple[Path, Path | None, Path]:
    """(target, drafter, prompt set); a SystemExit where one is missing or a spec arm of `arms` needs a drafter."""
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
    if drafter is None and any(not a.is_plain for a in arms):
        raise SystemExit("spec arms need --drafter (or --recipe)")
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


def _share(raw: str) -> float:
    value = float(raw)
    if not 0.0 < value <= 1.0:  # NaN too
        raise argparse.ArgumentTypeError(f"{raw}: must be in (0, 1]")
    return value


def memory_budget(device: torch.device, utilization: float) -> tuple[int, str]:
    """(bytes, where the figure comes from): the engine's own KV budget (memory.kv_budget) on the free memory now."""
    free, total = torch.cuda.mem_get_info(device) if device.type == "cuda" else (None, None)
    return kv_budget(utilization, free, total)


def weight_bytes(models: Sequence, dtype: torch.dtype, device: torch.device) -> int:
    """Bytes these weights will take on a CUDA device (in-memory tensors at dtype, checkpoint files taken
    as bf16); 0 on CPU, whose budget is the KV cache's alone."""
    if device.type != "cuda":
        return 0
    ckpts = [open_checkpoint(m) for m in models if m is not None]
    files = sum(f.stat().st_size for c in ckpts if c.tensors is None for f in Path(c.directory).glob("*.safetensors"))
    tensors = sum(t.numel() for c in ckpts if c.tensors is not None for t in c.tensors.values())
    return (tensors + files // 2) * dtype.itemsize


def plan_pool(grid: str, per_block: int, blocks: int, budget: tuple[int, str], later: int = 0) -> int:
    """`blocks` KV blocks plus the null block, refused (SystemExit naming the grid, the bytes needed and
    the bytes free) where they and `later` bytes of weights still to load exceed the budget."""
    blocks += 1
    need, (free, where) = blocks * per_block + later, budget
    if need > free:
        raise SystemExit(
            f"the grid {grid} does not fit: it needs {need:,} bytes ({need / 2**30:.2f} GiB: {blocks} KV blocks of "
            f"{per_block:,} bytes + {later:,} bytes of weights to load) but {max(free, 0):,} bytes are free "
            f"({where}); lower the concurrency or the prompt length, or raise --gpu-memory-utilization"
        )
    return blocks


def seq_blocks(seqs: int, max_model_len: int) -> int:
    """KV blocks `seqs` requests of max_model_len tokens hold."""
    return seqs * -(-max_model_len // BLOCK)


def make_engine(
    model: str | Path | Checkpoint,
    draft_model: str | Path | Checkpoint | None,
    args: argparse.Namespace,
    device: torch.device,
    *,
    max_num_seqs: int,
    seq_tokens: int,
    headroom: int = 0,
    **pool,
) -> Engine:
    """An engine for max_num_seqs sequences of seq_tokens (+ headroom; max_model_len one more), its KV
    pool sized within --gpu-memory-utilization and refused (plan_pool) before it is built where it does
    not fit. pool: blocks (null block excluded), grid (its name), later (other weights' bytes still to
    load), kv_from (run on that engine's target KV: engine_pair)."""
    utilization = getattr(args, "gpu_memory_utilization", EngineConfig.gpu_memory_utilization)
    max_model_len, kv_from = seq_tokens + headroom + 1, pool.get("kv_from")
    weights = [m if m is None or isinstance(m, Checkpoint) else str(m) for m in (model, draft_model)]
    cfg = dict(model=weights[0], draft_model=weights[1], device=device.type, dtype=args.dtype, backend=args.backend)
    cfg.update(cuda_graphs=not args.no_cuda_graphs, max_num_seqs=max_num_seqs, max_model_len=max_model_len)
    cfg.update(max_num_batched_tokens=max(8192, seq_tokens), kv_block_size=BLOCK, gpu_memory_utilization=utilization)
    if kv_from is None:
        dtype = torch_dtype(args.dtype, device)
        blocks = pool.get("blocks") or seq_blocks(max_num_seqs, max_model_len)
        grid = pool.get("grid") or f"{max_num_seqs} sequences of {max_model_len} tokens"
        later = weight_bytes([model, draft_model], dtype, device) + pool.get("later", 0)
        budget = memory_budget(device, utilization)
        cfg["num_kv_blocks"] = plan_pool(grid, pool_block_bytes(model, draft_model, dtype), blocks, budget, later)
    levers = {"max_batch": 0, "max_drafts": 0, "hedge": 0}
    return Engine(EngineConfig(**cfg, levers=levers, trace=False), kv_from=kv_from)


def engine_pair(
    target: str | Path | Checkpoint,
    drafter: str | Path | Checkpoint | None,
    args: argparse.Namespace,
    device: torch.device,
    *,
    max_num_seqs: int,
    seq_tokens: int,
    **pool,
) -> dict[str, Engine]:
    """{"plain"} or {"spec", "plain"}: the speculative engine owns the pool (pool: make_engine's) and the
    plain one runs on its target KV, so both arms fit where one pool does; they run one at a time."""
    size = dict(max_num_seqs=max_num_seqs, seq_tokens=seq_tokens)
    if drafter is None:
        return {"plain": make_engine(target, None, args, device, **size, **pool)}
    later = weight_bytes([target], torch_dtype(args.dtype, device), device)  # the plain engine's copy
    spec = make_engine(target, drafter, args, device, **size, headroom=drafter_block(drafter), later=later, **pool)
    return {"plain": make_engine(target, None, args, device, **size, kv_from=spec), "spec": spec}


def pool_block_bytes(target, drafter, dtype: torch.dtype) -> int:
    """Bytes one KV block takes over an engine's models (the target's, + the drafter's with one)."""
    gs = [Geometry.from_dict(open_checkpoint(target).config, "target")]
    if drafter is not None:
        gs.append(DFlashConfig.from_dict(open_checkpoint(drafter).config).geometry)
    return sum(kv_bytes_per_block(g.num_layers, BLOCK, g.num_kv_heads, g.head_dim, dtype) for g in gs)


def drafter_block(drafter: str | Path) -> int:
    """The drafter's block size: the KV headroom a speculative engine needs past each sequence."""
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
