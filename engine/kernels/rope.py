"""QK-norm + rotary embedding + paged KV store."""
from __future__ import annotations

import torch

from engine.kernels.norm import rms_norm_ref


def rope_cos_sin(max_positions: int, head_dim: int, theta: float, device: torch.device | str) -> torch.Tensor:
    """[max_positions, head_dim] fp32: cos(freqs) in the first half, sin(freqs) in the second."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim))
    pos = torch.arange(max_positions, device=device, dtype=torch.float32)
    freqs = torch.outer(pos, inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


def apply_rope_ref(x: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE (HF convention). x: [..., T, H, D]; cos_sin: [..., T, D] already gathered."""
    half = x.shape[-1] // 2
    cos = cos_sin[..., :half].repeat(*([1] * (cos_sin.dim() - 1)), 2).unsqueeze(-2).to(x.dtype)
    sin = cos_sin[..., half:].repeat(*([1] * (cos_sin.dim() - 1)), 2).unsqueeze(-2).to(x.dtype)
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def store_kv_ref(
    k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
) -> None:
    """Write rows with slot >= 0 into the paged caches ([num_blocks, block_size, Hkv, D])."""
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    num_kv_heads, head_dim = k_cache.shape[-2:]
    k_cache.view(-1, num_kv_heads, head_dim)[slots] = k[valid].to(k_cache.dtype)
    v_cache.view(-1, num_kv_heads, head_dim)[slots] = v[valid].to(v_cache.dtype)


def qk_norm_rope_store_ref(
    q: torch.Tensor | None,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    q_norm_weight: torch.Tensor | None,
    k_norm_weight: torch.Tensor,
    cos_sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    eps: float,
) -> torch.Tensor | None:
    """Per-head RMSNorm of q and k, RoPE at `positions`, store k/v at `slot_mapping`.

    q: [T, Hq, D] or None; k, v: [T, Hkv, D] (views into a fused projection are fine).
    Returns the rotated q ([T, Hq, D], contiguous) or None.
    """
    cs = cos_sin[positions]
    k_out = apply_rope_ref(rms_norm_ref(k, k_norm_weight, eps), cs)
    store_kv_ref(k_out, v, slot_mapping, k_cache, v_cache)
    if q is None:
        return None
    return apply_rope_ref(rms_norm_ref(q, q_norm_weight, eps), cs).contiguous()
