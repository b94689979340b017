"""Op families, each a torch reference and (on CUDA) a Triton kernel; `get_ops` picks a backend."""

from __future__ import annotations

from functools import partial

from engine.kernels.attention import paged_attention_ref
from engine.kernels.fused_linear import (
    add_rms_norm_linear_batch_invariant_ref,
    add_rms_norm_linear_ref,
    silu_mul_linear_batch_invariant_ref,
    silu_mul_linear_ref,
)
from engine.kernels.linear import linear_batch_invariant_ref, linear_ref
from engine.kernels.mlp import composed
from engine.kernels.norm import add_rms_norm_ref, rms_norm_ref
from engine.kernels.ops import Ops
from engine.kernels.rope import qk_norm_rope_store_ref
from engine.kernels.sampling import accept_prefix_ref, argmax_ref
from engine.kernels.span_meta import span_meta_ref

BACKENDS = ("torch", "triton")


def torch_ops(batch_invariant: bool = False) -> Ops:
    return Ops(
        name="torch",
        rms_norm=rms_norm_ref,
        add_rms_norm=add_rms_norm_ref,
        add_rms_norm_linear=add_rms_norm_linear_batch_invariant_ref if batch_invariant else add_rms_norm_linear_ref,
        add_rms_norm_qkv=add_rms_norm_linear_batch_invariant_ref if batch_invariant else add_rms_norm_linear_ref,
        qk_norm_rope_store=qk_norm_rope_store_ref,
        paged_attention=partial(paged_attention_ref, batch_invariant=batch_invariant),
        linear=linear_batch_invariant_ref if batch_invariant else linear_ref,
        silu_mul_linear=silu_mul_linear_batch_invariant_ref if batch_invariant else silu_mul_linear_ref,
        linear_to_residual=linear_batch_invariant_ref if batch_invariant else linear_ref,
        silu_mul_linear_to_residual=silu_mul_linear_batch_invariant_ref if batch_invariant else silu_mul_linear_ref,
        mlp_to_residual=(
            composed(add_rms_norm_linear_batch_invariant_ref, silu_mul_linear_batch_invariant_ref)
            if batch_invariant
            else composed(add_rms_norm_linear_ref, silu_mul_linear_ref)
        ),
        argmax=argmax_ref,
        accept_prefix=accept_prefix_ref,
        span_meta=span_meta_ref,
    )


def get_ops(backend: str, batch_invariant: bool = False) -> Ops:
    if backend == "torch":
        return torch_ops(batch_invariant)
    if backend == "triton":
        from engine.kernels.triton_ops import triton_ops

        return triton_ops(batch_invariant)
    raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")
