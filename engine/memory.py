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


class KVBudgetError(ValueError):
    """A KV pool that cannot hold what the configuration asks (one request of max_model_len, or the
    blocks named), refused before it is allocated; the message names the blocks and bytes."""


def plan_kv_blocks(
    config: EngineConfig,
    geometries: list[Geometry],
    dtype: torch.dtype,
    device: torch.device,
    max_blocks_per_seq: int,
    scratch: int,
) -> int:
    """Total KV blocks (one block covers every model in `geometries`), hedge scratch included. Refused,
    naming the bytes, where the budget cannot hold one request of max_model_len or the blocks asked for
    do not fit in the device's free memory."""
    per_block = sum(
        kv_bytes_per_block(g.num_layers, config.kv_block_size, g.num_kv_heads, g.head_dim, dtype) for g in geometries
    )
    free, total = torch.cuda.mem_get_info(device) if device.type == "cuda" else (None, None)
    if config.num_kv_blocks is not None:
        if config.num_kv_blocks - scratch < 2:
            raise KVBudgetError(
                f"EngineConfig.num_kv_blocks={config.num_kv_blocks} leaves no KV pool after "
                f"{scratch} hedge scratch blocks and the reserved block 0 (usable: N - 1 - scratch)"
            )
        if config.max_model_len is not None:  # a default max_model_len: the scheduler refuses what does not fit
            _holds_one(config.num_kv_blocks, max_blocks_per_seq, scratch, config.kv_block_size, per_block)
        need = config.num_kv_blocks * per_block
        if free is not None and need > free:
            raise KVBudgetError(
                f"EngineConfig.num_kv_blocks={config.num_kv_blocks} needs {_gib(need)} of KV cache "
                f"({per_block} bytes a block) but the device has {_gib(free)} free"
            )
        return config.num_kv_blocks
    want = config.max_num_seqs * max_blocks_per_seq + 1 + scratch
    budget, where = kv_budget(config.gpu_memory_utilization, free, total)
    one = max_blocks_per_seq + 1 + scratch  # one request of max_model_len, block 0 and the hedge scratch
    fits = max(budget, 0) // per_block
    if fits < one:
        raise KVBudgetError(
            f"the KV cache budget ({_gib(budget)}: {where}) holds {fits} blocks, but one request of max_model_len "
            f"({max_blocks_per_seq * config.kv_block_size} tokens) needs {one} ({_gib(one * per_block)}): lower "
            "max_model_len or raise gpu_memory_utilization"
        )
    if fits < want:
        log.warning("KV cache limited to %d blocks (wanted %d) by the memory budget", fits, want)
    return int(min(want, fits))


def check_shared(
    kv: list, g: Geometry, bs: int, dtype: torch.dtype, device: torch.device, max_blocks: int, scratch: int
) -> int:
    """The blocks of another engine's target KV (per layer (k, v) [blocks, block, kv heads, head dim]),
    refused unless its layers, shape, dtype and device are this target's and it holds one request of
    max_model_len (max_blocks blocks)."""
    k = kv[0][0]
    want = (g.num_layers, bs, g.num_kv_heads, g.head_dim, dtype, device.type)
    if (got := (len(kv), *k.shape[1:], k.dtype, k.device.type)) != want:
        raise ValueError(
            f"kv_from: the shared KV (layers, block, kv heads, head dim, dtype, device) {got} is not {want}"
        )
    per_block = kv_bytes_per_block(g.num_layers, bs, g.num_kv_heads, g.head_dim, dtype)
    _holds_one(k.shape[0], max_blocks, scratch, bs, per_block)
    return k.shape[0]


def _holds_one(blocks: int, max_blocks: int, scratch: int, block_size: int, per_block: int) -> None:
    """Refuse a pool of `blocks` (block 0 and `scratch` hedge blocks not handed out) that cannot hold
    one request of max_blocks blocks."""
    if blocks - 1 - scratch < max_blocks:
        one = max_blocks + 1 + scratch
        raise KVBudgetError(
            f"a KV pool of {blocks} blocks ({_gib(blocks * per_block)}) cannot hold one request of max_model_len "
            f"({max_blocks * block_size} tokens): that needs {one} blocks ({one * per_block:,} bytes, "
            f"{per_block:,} a block, block 0 and {scratch} hedge scratch blocks included); lower max_model_len or "
            "give the pool more blocks"
        )


def kv_budget(utilization: float, free: int | None, total: int | None) -> tuple[int, str]:
    """(bytes the KV cache may take, where that figure comes from): on a device of `total` bytes with
    `free` free, its utilization share less what is in use and the activation reserve; on CPU (free
    None) the CPU KV budget."""
    if free is None or total is None:
        return CPU_KV_BUDGET, "the CPU KV budget"
    where = f"gpu_memory_utilization={utilization} of the device, less what is in use and a "
    return int(total * utilization) - (total - free) - ACTIVATION_RESERVE, where + f"{_gib(ACTIVATION_RESERVE)} reserve"


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"
