"""How many KV blocks the engine allocates: enough for max_num_seqs full-length requests (plus the
hedge scratch), within the device's memory budget."""

from __future__ import annotations

import logging

import torch

from engine.config import EngineConfig
from engine.kv_cache import kv_bytes_per_block
from engine.models.config import Geometry

log = logging.getLogger(__name__)

ACTIVATION_RESERVE = 4 << 30  # activations, logits and CUDA-graph pools
CPU_KV_BUDGET = 8 << 30


def plan_kv_blocks(
    config: EngineConfig,
    geometries: list[Geometry],
    dtype: torch.dtype,
    device: torch.device,
    max_blocks_per_seq: int,
    scratch: int,
) -> int:
    """Total KV blocks (one block covers every model in `geometries`), hedge scratch included."""
    if config.num_kv_blocks is not None:
        if config.num_kv_blocks - scratch < 2:
            raise ValueError(
                f"EngineConfig.num_kv_blocks={config.num_kv_blocks} leaves no KV pool after "
                f"{scratch} hedge scratch blocks and the reserved block 0 (usable: N - 1 - scratch)"
            )
        return config.num_kv_blocks
    want = config.max_num_seqs * max_blocks_per_seq + 1 + scratch
    per_block = sum(
        kv_bytes_per_block(g.num_layers, config.kv_block_size, g.num_kv_heads, g.head_dim, dtype) for g in geometries
    )
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        budget = int(total * config.gpu_memory_utilization) - (total - free) - ACTIVATION_RESERVE
    else:
        budget = CPU_KV_BUDGET
    fits = max(2 + scratch, budget // per_block)
    if fits < want:
        log.warning("KV cache limited to %d blocks (wanted %d) by the memory budget", fits, want)
    return int(min(want, fits))
