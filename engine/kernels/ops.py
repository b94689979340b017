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
    qk_norm_rope_store: Callable
    paged_attention: Callable
    linear: Callable
    silu_mul_linear: Callable  # down(silu(gate) * up) from the [M, 2I] gate|up: the MLP's second half
    argmax: Callable
    accept_prefix: Callable
