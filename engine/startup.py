"""Engine start-up: device and dtype from the config, checkpoints to models, the context limit, the KV
cache and the runner."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.config import EngineConfig
from engine.hedge import ScratchKV, chain_blocks, effective_positions
from engine.kernels import Ops
from engine.kv_cache import BlockManager
from engine.levers import Levers
from engine.loader import open_checkpoint
from engine.memory import check_shared, plan_kv_blocks
from engine.models.config import DFlashConfig, Qwen3Config
from engine.models.dflash import DFlashDrafter
from engine.models.qwen3 import Qwen3ForCausalLM
from engine.runner import ModelRunner
from engine.tokenizing import eos_ids, load_tokenizer

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
DEFAULT_MAX_MODEL_LEN = 4096


def resolve_device(config: EngineConfig) -> tuple[torch.device, torch.dtype, str]:
    """(device, dtype, backend) with every "auto" decided."""
    if config.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("EngineConfig.device='cuda' but no CUDA device is available")
    auto = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(auto if config.device == "auto" else config.device)
    cuda = device.type == "cuda"
    dtype = _DTYPES[config.dtype] if config.dtype != "auto" else (torch.bfloat16 if cuda else torch.float32)
    backend = config.backend if config.backend != "auto" else ("triton" if cuda else "torch")
    if backend == "triton" and not cuda:
        raise ValueError("the triton backend needs a CUDA device; use backend='torch' on CPU")
    return device, dtype, backend


@dataclass
class Models:
    target_cfg: Qwen3Config
    target: Qwen3ForCausalLM
    draft_cfg: DFlashConfig | None
    drafter: DFlashDrafter | None
    tokenizer: object | None
    eos_ids: tuple[int, ...]
    names: str  # "target" or "target + drafter", for the log


def load_models(config: EngineConfig, device: torch.device, dtype: torch.dtype, ops: Ops) -> Models:
    """Both configs are read and checked against each other before any tensor is loaded."""
    target = open_checkpoint(config.model)
    target_cfg = Qwen3Config.from_dict(target.config, where=target.name)
    draft = draft_cfg = None
    if config.draft_model:
        draft = open_checkpoint(config.draft_model)
        draft_cfg = DFlashConfig.from_dict(draft.config, where=draft.name)
        draft_cfg.check_fits(target_cfg)
    where = dict(device=device, dtype=dtype, ops=ops)
    model = Qwen3ForCausalLM(target_cfg, target.load_tensors(), where=target.name, **where)
    drafter = None
    if draft is not None:
        drafter = DFlashDrafter(draft_cfg, draft.load_tensors(), where=draft.name, target=model, **where)
    tokenizer = load_tokenizer(target.directory)
    names = target.name + (f" + drafter {draft.name}" if draft else "")
    return Models(
        target_cfg, model, draft_cfg, drafter, tokenizer, eos_ids(target_cfg, target.directory, tokenizer), names
    )


def max_model_len(config: EngineConfig, models: Models) -> int:
    limits = [models.target_cfg.geometry.max_position_embeddings]
    if models.draft_cfg:
        limits.append(models.draft_cfg.geometry.max_position_embeddings)
    if config.max_model_len is None:
        return min(*limits, DEFAULT_MAX_MODEL_LEN)
    if config.max_model_len > min(limits):
        raise ValueError(f"EngineConfig.max_model_len={config.max_model_len} exceeds the models' limit {min(limits)}")
    return config.max_model_len


def build_runner(
    config: EngineConfig, models: Models, levers: Levers, max_len: int, use_graphs: bool, shared_kv: list | None = None
) -> tuple[ModelRunner, BlockManager, ScratchKV | None]:
    """The KV cache (the pool, plus hedge scratch reserved outside it so a round never runs out of
    KV: one set of blocks per chain a round can verify) and the runner over it; shared_kv: another
    engine's target KV, taken whole instead of allocating one (its shape must be this target's)."""
    bs = config.kv_block_size
    max_blocks_per_seq = -(-max_len // bs)
    per_round = models.draft_cfg.drafts_per_round if models.draft_cfg else 0
    drafter = models.drafter
    chains = 0
    if levers.hedge and drafter is not None and drafter.markov is not None:
        chains = min(levers.hedge, config.max_num_seqs) * len(effective_positions(levers.hedge_positions, per_round))
    per_chain = chain_blocks(1 + per_round, bs)
    geometries = [models.target_cfg.geometry] + ([models.draft_cfg.geometry] if models.draft_cfg else [])
    dtype, device = models.target.dtype, models.target.device
    if shared_kv is None:
        num_blocks = plan_kv_blocks(config, geometries, dtype, device, max_blocks_per_seq, chains * per_chain)
    else:
        num_blocks = check_shared(shared_kv, geometries[0], bs, dtype, device, max_blocks_per_seq, chains * per_chain)
    pool = num_blocks - chains * per_chain
    runner = ModelRunner(
        models.target,
        drafter,
        num_blocks=num_blocks,
        block_size=bs,
        max_num_seqs=config.max_num_seqs,
        max_blocks_per_seq=max_blocks_per_seq,
        use_graphs=use_graphs,
        chain_rows=chains,
        shared_kv=shared_kv,
        draft_window=config.draft_window,
    )
    scratch = ScratchKV(runner, pool, chains, per_chain) if chains else None
    return runner, BlockManager(pool, bs), scratch
