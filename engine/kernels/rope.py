"""QK-norm + rotary embedding + paged KV store. The Triton kernel also takes q|k|v as the fp32
partials of a split-K projection (split_sum.SplitSum): it sums them in split order and rounds them
as the reduce kernel would, so that reduce's launch goes away and every result stays bit-identical."""

from __future__ import annotations

import torch

from engine.kernels._triton import cdiv, jit, next_pow2, pdl
from engine.kernels.norm import rms_norm_ref
from engine.kernels.rotary import apply_rope_ref
from engine.kernels.split_sum import SplitSum


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


# --- Triton ---------------------------------------------------------------------------------
tl = None  # triton.language, bound by _triton.bind at the first launch
# Under PDL the kernel reads what no earlier kernel of the step is still writing (positions, slots,
# cos/sin, the norm weights) before its wait, so the position -> cos/sin chain of loads runs while
# q|k|v drains: every kernel before q|k|v has completed once q|k|v lets this one launch (its own
# wait returned).


@jit
def _norm_weights(w_ptr, D: tl.constexpr):
    """A norm weight and its rotate-half partner, [1, D] fp32 each."""
    d = tl.arange(0, D)
    w = tl.load(w_ptr + d).to(tl.float32)[None, :]
    return w, tl.load(w_ptr + (d + D // 2) % D).to(tl.float32)[None, :]


@jit
def _rows(ptrs, mask, stride_s, SPLITS: tl.constexpr, ROUND_TY: tl.constexpr):
    """The values at ptrs as fp32; with SPLITS > 0 the sum of that many fp32 partial planes stride_s
    apart, in plane order, rounded to ROUND_TY (split_sum's reduce: the same adds, the same rounding)."""
    if SPLITS == 0:
        return tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    acc = tl.zeros(ptrs.shape, tl.float32)
    for s in tl.static_range(SPLITS):
        acc += tl.load(ptrs + s * stride_s, mask=mask, other=0.0)
    return acc.to(ROUND_TY).to(tl.float32)


@jit
def _norm_rope_heads(
    row_ptr,
    stride_h,
    stride_s,
    heads,
    hmask,
    w,
    wp,
    cos,
    sin,
    eps,
    OUT_TY: tl.constexpr,
    D: tl.constexpr,
    SPLITS: tl.constexpr,
):
    """RMSNorm + rotate-half RoPE of [HEADS, D] rows (w, wp: _norm_weights; SPLITS, stride_s: _rows);
    rounds where the reference rounds."""
    d = tl.arange(0, D)
    partner = (d + D // 2) % D
    ptrs = row_ptr + heads[:, None] * stride_h
    x = _rows(ptrs + d[None, :], hmask[:, None], stride_s, SPLITS, OUT_TY)
    xp = _rows(ptrs + partner[None, :], hmask[:, None], stride_s, SPLITS, OUT_TY)
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / D + eps)[:, None]
    n = (w * (x * rstd).to(OUT_TY).to(tl.float32)).to(OUT_TY).to(tl.float32)
    npart = (wp * (xp * rstd).to(OUT_TY).to(tl.float32)).to(OUT_TY).to(tl.float32)
    rot = tl.where(d[None, :] < D // 2, -npart, npart)
    a = (n * cos.to(OUT_TY).to(tl.float32)).to(OUT_TY).to(tl.float32)
    b = (rot * sin.to(OUT_TY).to(tl.float32)).to(OUT_TY).to(tl.float32)
    return (a + b).to(OUT_TY)


@jit
def _qk_norm_rope_store_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    pos_ptr,
    slot_ptr,
    qw_ptr,
    kw_ptr,
    cs_ptr,
    kc_ptr,
    vc_ptr,
    qo_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cs,
    stride_kcb,
    stride_kco,
    stride_kch,
    stride_vcb,
    stride_vco,
    stride_vch,
    stride_s,
    block_size,
    eps,
    HQ: tl.constexpr,
    HKV: tl.constexpr,
    D: tl.constexpr,
    HB: tl.constexpr,
    HAS_Q: tl.constexpr,
    SPLITS: tl.constexpr,
    PDL: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    d = tl.arange(0, D)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    cs = cs_ptr + pos * stride_cs + d % (D // 2)
    cos = tl.load(cs)[None, :]
    sin = tl.load(cs + D // 2)[None, :]
    slot = tl.load(slot_ptr + t).to(tl.int64)
    kw, kwp = _norm_weights(kw_ptr, D)
    qw, qwp = _norm_weights(qw_ptr, D)
    if PDL:  # the inputs above were written before the kernel before this one ran
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    n_kv_progs = tl.cdiv(HKV, HB)
    if j < n_kv_progs:
        heads = j * HB + tl.arange(0, HB)
        hmask = heads < HKV
        if slot >= 0:
            kc_ty = kc_ptr.dtype.element_ty
            k_row = k_ptr + t * stride_kt
            k = _norm_rope_heads(k_row, stride_kh, stride_s, heads, hmask, kw, kwp, cos, sin, eps, kc_ty, D, SPLITS)
            blk = slot // block_size
            off = slot % block_size
            kdst = kc_ptr + blk * stride_kcb + off * stride_kco + heads[:, None] * stride_kch + d[None, :]
            tl.store(kdst, k, mask=hmask[:, None])
            vc_ty = vc_ptr.dtype.element_ty
            v_rows = v_ptr + t * stride_vt + heads[:, None] * stride_vh + d[None, :]
            v = _rows(v_rows, hmask[:, None], stride_s, SPLITS, vc_ty)  # fp32 holds v exactly
            vdst = vc_ptr + blk * stride_vcb + off * stride_vco + heads[:, None] * stride_vch + d[None, :]
            tl.store(vdst, v.to(vc_ty), mask=hmask[:, None])
    elif HAS_Q:
        heads = (j - n_kv_progs) * HB + tl.arange(0, HB)
        hmask = heads < HQ
        qo_ty = qo_ptr.dtype.element_ty
        q_row = q_ptr + t * stride_qt
        q = _norm_rope_heads(q_row, stride_qh, stride_s, heads, hmask, qw, qwp, cos, sin, eps, qo_ty, D, SPLITS)
        tl.store(qo_ptr + t * (HQ * D) + heads[:, None] * D + d[None, :], q, mask=hmask[:, None])


def qk_norm_rope_store(
    q: torch.Tensor | SplitSum | None,
    k: torch.Tensor | SplitSum,
    v: torch.Tensor | SplitSum,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    q_norm_weight: torch.Tensor | None,
    k_norm_weight: torch.Tensor,
    cos_sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    eps: float,
) -> torch.Tensor | None:
    """Triton `qk_norm_rope_store_ref` in one launch: grid (T, kv-head groups + q-head groups).

    q/k/v may be strided head views into a fused projection (the last dim must be unit-stride), or
    SplitSums of such views of one split-K projection's partials (layers.heads), of the caches' dtype.
    """
    splits, stride_s, dtype = 0, 0, None
    if isinstance(k, SplitSum):
        assert isinstance(v, SplitSum) and (q is None or isinstance(q, SplitSum)), "q, k, v: all SplitSums or none"
        assert k.dtype == v.dtype == k_cache.dtype == v_cache.dtype, "partials round to the caches' dtype"
        splits, stride_s, dtype = k.parts.shape[0], k.parts.stride(0), k.dtype
        assert all(x.parts.stride(0) == stride_s for x in (q, v) if x is not None), "one projection's partials"
        q, k, v = (None if x is None else x.parts[0] for x in (q, k, v))
    num_tokens, num_kv_heads, head_dim = k.shape
    assert head_dim == next_pow2(head_dim) and head_dim >= 2, "head_dim must be a power of two"
    q_out = None
    if q is not None:
        q_dtype = torch.promote_types(dtype or q.dtype, q_norm_weight.dtype)
        assert not splits or q_dtype == dtype, "partials round to the caches' dtype: so must q"
        q_out = torch.empty(q.shape, dtype=q_dtype, device=q.device)
    if num_tokens == 0:
        return q_out
    num_q_heads = q.shape[1] if q is not None else 0
    # ~1K elements per program keeps every head block in registers.
    hb = min(next_pow2(max(num_q_heads, num_kv_heads)), max(1, 1024 // head_dim))
    grid = (num_tokens, cdiv(num_kv_heads, hb) + cdiv(num_q_heads, hb))
    q_, qw = (q, q_norm_weight) if q is not None else (k, k_norm_weight)
    for t in (q_, k, v):
        assert t.stride(-1) == 1, "q/k/v need a unit-stride head_dim"
    _qk_norm_rope_store_kernel[grid](
        q_,
        k,
        v,
        positions,
        slot_mapping,
        qw,
        k_norm_weight,
        cos_sin,
        k_cache,
        v_cache,
        q_out if q_out is not None else k_cache,
        q_.stride(0),
        q_.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        cos_sin.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        stride_s,
        k_cache.shape[1],
        eps,
        HQ=num_q_heads,
        HKV=num_kv_heads,
        D=head_dim,
        HB=hb,
        HAS_Q=q is not None,
        SPLITS=splits,
        num_warps=4,
        **pdl(k.device, num_tokens),
    )
    return q_out
