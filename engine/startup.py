"""Engine start-up: device and dtype from the config, checkpoints to models, the context limit."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from engine.config import EngineConfig
from engine.kernels import Ops
from engine.loader import open_checkpoint
from engine.models.config import DFlashConfig, Qwen3Config
from engine.models.dflash import DFlashDrafter
from engine.models.qwen3 import Qwen3ForCausalLM
from engine.tokenizing import eos_ids, load_tokenizer

log = logging.getLogger(__name__)

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
