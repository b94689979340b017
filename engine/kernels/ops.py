"""`Ops`: the op families a backend provides (the torch references or the Triton kernels)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Ops:
    name: str
    rms_norm: Callable
    add_rms_norm: Callable
    add_rms_norm_linear: Callable  # (linear(add_rms_norm(x, residual)), x + residual): norm into the projection
    # add_rms_norm_linear for q|k|v: the first result may be a split_sum.SplitSum, which qk_norm_rope_store
    # takes (as [.., heads, head_dim] column views of its partials).
    add_rms_norm_qkv: Callable
    qk_norm_rope_store: Callable
    paged_attention: Callable
    linear: Callable
    silu_mul_linear: Callable  # down(silu(gate) * up) from the [M, 2I] gate|up: the MLP's second half
    # linear / silu_mul_linear for products only added to the residual stream (o, down): the result
    # may be a split_sum.SplitSum, which add_rms_norm(_linear) take and split_sum.dense sums for anything else.
    linear_to_residual: Callable
    silu_mul_linear_to_residual: Callable
    # (down(silu(gate) * up) of add_rms_norm(x, residual), x + residual): the MLP, its kernels chosen
    # per row count (mlp.py); the first result as silu_mul_linear_to_residual's.
    mlp_to_residual: Callable
    argmax: Callable
    accept_prefix: Callable
    span_meta: Callable  # a uniform span step's positions, slots and attention bounds (span_meta.py)
