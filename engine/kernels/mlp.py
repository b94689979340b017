"""The MLP after the attention as one op: residual add + RMSNorm, gate|up, SwiGLU, down.

The Triton form picks the kernels per row count. At one row the norm runs in gate|up's prologue and
SwiGLU in down's (fused_linear). From 2 to GLU_MAX_ROWS rows, where neither prologue serves, gate|up
forms SwiGLU in its epilogue (gemm.py's GLU): the [M, 2I] product is never stored and the
silu_and_mul launch goes away, rounded exactly as that kernel rounds. Elsewhere the unfused ops run."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from engine.kernels.fused_linear import (
    add_rms_norm_linear,
    add_rms_norm_linear_config,
    silu_mul_linear,
    silu_mul_linear_config,
)
from engine.kernels.gemm import launch
from engine.kernels.linear import as_rows, dispatch_config, linear, skinny_config
from engine.kernels.norm import add_rms_norm
from engine.kernels.split_sum import SplitSum
from engine.kernels.tuning import SkinnyConfig, TunedTables

# Rows up to which gate|up takes the SwiGLU epilogue (0: never, the dispatch before it). At 32 and 64
# rows it needs the TMA GEMM (a tma=1 gate|up entry): on the tl.dot kernel's cp.async loads it ran 1.17x
# and 1.00x the time of the pair (kernel_ab at cf872c1, H200), on TMA 0.95x (kernel_ab at b3a11e7).
GLU_MAX_ROWS = 64

Mlp = Callable[..., tuple[torch.Tensor | SplitSum, torch.Tensor]]


def composed(norm_linear: Callable, swiglu_linear: Callable) -> Mlp:
    """The MLP from an add_rms_norm_linear and a silu_mul_linear (a backend's, or their references)."""

    def mlp(
        x: torch.Tensor | SplitSum,
        residual: torch.Tensor,
        norm_weight: torch.Tensor,
        eps: float,
        gate_up: torch.Tensor,
        down: torch.Tensor,
    ) -> tuple[torch.Tensor | SplitSum, torch.Tensor]:
        """(down(silu(gate) * up) of rms_norm(x + residual), x + residual)."""
        projected, summed = norm_linear(x, residual, norm_weight, eps, gate_up)
        return swiglu_linear(projected, down), summed

    return mlp


def glu_config(
    m: int, gate_up_shape: tuple[int, int], down_shape: tuple[int, int], tables: TunedTables
) -> SkinnyConfig | None:
    """gate|up's tl.dot config at m rows with half its BLOCK_N (each program streams the same weight
    bytes: its columns of gate and of up), where the epilogue serves: 2..GLU_MAX_ROWS rows, gate|up on
    the tl.dot path without split-K, and neither prologue taken at m."""
    (n2, k), (n, inter) = gate_up_shape, down_shape
    if not 2 <= m <= GLU_MAX_ROWS or n2 != 2 * inter:
        return None
    if add_rms_norm_linear_config(m, n2, k, tables) or silu_mul_linear_config(m, n, inter, tables):
        return None
    cfg = skinny_config(m, n2, k, tables)
    if cfg is None or cfg.block_m == 1 or cfg.split_k != 1:
        return None
    return cfg._replace(block_n=max(16, cfg.block_n // 2))


def swiglu_linear_with_config(x: torch.Tensor, gate_up: torch.Tensor, cfg: SkinnyConfig) -> torch.Tensor:
    """silu(x @ gate^T) * (x @ up^T), [M, I], for gate_up = [gate | up] ([2I, K], contiguous) and x
    [M, K] unit-stride rows, with an explicit tl.dot config (split_k 1)."""
    assert x.shape[1] == gate_up.shape[1], (x.shape, gate_up.shape)
    return launch(x, gate_up, cfg, glu=True)


def mlp_to_residual(
    x: torch.Tensor | SplitSum,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    gate_up: torch.Tensor,
    down: torch.Tensor,
) -> tuple[torch.Tensor | SplitSum, torch.Tensor]:
    """Triton MLP on [M, H] rows; the first result may be down's split-K partials (a SplitSum, as
    silu_mul_linear's with defer), since it is only added to the residual stream."""
    cfg = dispatch_config(partial(_glu_for, down_shape=tuple(down.shape)), residual, gate_up, gate_up.shape[1])
    if cfg is None or residual.dim() != 2 or len({x.dtype, residual.dtype, norm_weight.dtype, gate_up.dtype}) != 1:
        return _unfused(x, residual, norm_weight, eps, gate_up, down)
    normed, summed = add_rms_norm(x, residual, norm_weight, eps)
    return linear(swiglu_linear_with_config(as_rows(normed), gate_up, cfg), down, defer=True), summed


def _glu_for(m: int, n2: int, k: int, tables: TunedTables, down_shape: tuple[int, int]) -> SkinnyConfig | None:
    return glu_config(m, (n2, k), down_shape, tables)


_unfused = composed(add_rms_norm_linear, partial(silu_mul_linear, defer=True))
