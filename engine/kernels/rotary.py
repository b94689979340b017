"""Rotary position embedding in plain torch: the cos|sin table and the rotate-half reference."""

from __future__ import annotations

import torch


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
