"""The triton backend: every `Ops` field backed by a Triton kernel (GEMMs above the skinny-M
crossover go to cuBLAS). Imported only when the triton backend is asked for."""

from __future__ import annotations

from functools import partial

from engine.kernels._triton import require_triton
from engine.kernels.attention import paged_attention
from engine.kernels.fused_linear import (
    add_rms_norm_linear,
    add_rms_norm_linear_batch_invariant,
    add_rms_norm_qkv,
    silu_mul_linear,
    silu_mul_linear_batch_invariant,
)
from engine.kernels.linear import linear, linear_batch_invariant
from engine.kernels.mlp import composed, mlp_to_residual
from engine.kernels.norm import add_rms_norm, rms_norm
from engine.kernels.ops import Ops
from engine.kernels.rope import qk_norm_rope_store
from engine.kernels.sampling import accept_prefix, argmax
from engine.kernels.span_meta import span_meta


def triton_ops(batch_invariant: bool = False) -> Ops:
    """batch_invariant: fixed-tile GEMM for every M and one attention config for every batch/span,
    so a row's output is bit-identical however many rows share the step."""
    require_triton()
    return Ops(
        name="triton",
        rms_norm=rms_norm,
        add_rms_norm=add_rms_norm,
        add_rms_norm_linear=add_rms_norm_linear_batch_invariant if batch_invariant else add_rms_norm_linear,
        add_rms_norm_qkv=add_rms_norm_linear_batch_invariant if batch_invariant else add_rms_norm_qkv,
        qk_norm_rope_store=qk_norm_rope_store,
        paged_attention=partial(paged_attention, batch_invariant=batch_invariant),
        linear=linear_batch_invariant if batch_invariant else linear,
        silu_mul_linear=silu_mul_linear_batch_invariant if batch_invariant else silu_mul_linear,
        linear_to_residual=linear_batch_invariant if batch_invariant else partial(linear, defer=True),
        silu_mul_linear_to_residual=(
            silu_mul_linear_batch_invariant if batch_invariant else partial(silu_mul_linear, defer=True)
        ),
        mlp_to_residual=(
            composed(add_rms_norm_linear_batch_invariant, silu_mul_linear_batch_invariant)
            if batch_invariant
            else mlp_to_residual
        ),
        argmax=argmax,
        accept_prefix=accept_prefix,
        span_meta=span_meta,
    )
