"""The ops `engine.bench.kernel_ab` times, each as the engine dispatches it at the Qwen3-4B shapes:
a case is (bytes the op must move, data copies to cycle over, fn(i), the fp32 reference, the "after"
side's fn(i)); kernel_ab runs fn under the row's switch back to the previous dispatch and after_fn
without it."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from engine.bench import kernel_cases as cases
from engine.kernels import activation, attention, fused_linear, gemm, linear, mlp, norm, rope, tuning
from engine.kernels.tuning import SkinnyConfig

EPS = 1e-6


@contextmanager
def setting(module, name: str, value) -> Iterator[None]:
    """module.name = value inside, restored after."""
    saved = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, saved)


def norm_case(n: int, k: int, m: int, cfg: SkinnyConfig | None = None):
    """add + RMSNorm -> the projection as dispatched; with cfg, the "after" side runs that config."""
    nbytes, copies, ws = cases.rotated_weights(n, k)
    x, r = (
        torch.randn(m, k, device=cases.DEVICE).to(cases.DTYPE),
        torch.randn(m, k, device=cases.DEVICE).to(cases.DTYPE),
    )
    nw = torch.rand(k, device=cases.DEVICE).add_(0.5).to(cases.DTYPE)
    fn = lambda i: fused_linear.add_rms_norm_linear(x, r, nw, EPS, ws[i])[0]  # noqa: E731
    with_cfg = lambda i: fused_linear.add_rms_norm_linear_with_config(x, r, nw, EPS, ws[i], cfg)[0]  # noqa: E731
    ref = torch.nn.functional.linear(norm.add_rms_norm_ref(x.float(), r.float(), nw.float(), EPS)[0], ws[0].float())
    return nbytes, copies, fn, ref, with_cfg if cfg is not None else fn


def pair_case(first: tuple[int, int], second_n: int, swiglu: bool, m: int = 1, cfg: SkinnyConfig | None = None):
    """m rows through o (or SwiGLU->down) into add + RMSNorm -> the next projection (gate|up, or
    q|k|v), both as the engine dispatches them: the reduce kernel, or (after) none. cfg: the "after"
    side runs the first projection at that config (its partials deferred as the dispatch's are)."""
    (n, k), h = first, first[0]
    b1, c1, w1 = cases.rotated_weights(n, k)
    b2, c2, w2 = cases.rotated_weights(second_n, h)
    x = torch.randn(m, 2 * k if swiglu else k, device=cases.DEVICE).to(cases.DTYPE)
    r, nw = torch.randn(m, h, device=cases.DEVICE).to(cases.DTYPE), torch.rand(h, device=cases.DEVICE).add_(0.5)
    nw = nw.to(cases.DTYPE)
    produce = fused_linear.silu_mul_linear if swiglu else linear.linear
    fn = lambda i: fused_linear.add_rms_norm_linear(produce(x, w1[i], defer=True), r, nw, EPS, w2[i])[0]  # noqa: E731
    at_cfg = fused_linear.silu_mul_linear_with_config if swiglu else linear.linear_with_config
    with_cfg = lambda i: fused_linear.add_rms_norm_linear(at_cfg(x, w1[i], cfg, defer=True), r, nw, EPS, w2[i])[0]  # noqa: E731
    mid = (
        fused_linear.silu_mul_linear_ref(x.float(), w1[0].float())
        if swiglu
        else linear.linear_ref(x.float(), w1[0].float())
    )
    ref = torch.nn.functional.linear(norm.add_rms_norm_ref(mid, r.float(), nw.float(), EPS)[0], w2[0].float())
    return b1 + b2, min(c1, c2), fn, ref, with_cfg if cfg is not None else fn


def on_gemv(fn: Callable, *args) -> torch.Tensor:
    with setting(gemm, "EARLY_WEIGHTS", gemm.PROLOGUES):
        return fn(*args)


def proj_case(n: int, k: int, m: int, swiglu: bool, cfg: SkinnyConfig | None = None):
    """o (or SwiGLU->down) as dispatched; with cfg, the "after" side runs that config instead."""
    nbytes, copies, ws = cases.rotated_weights(n, k)
    x = torch.randn(m, 2 * k if swiglu else k, device=cases.DEVICE).to(cases.DTYPE)
    if swiglu:
        fn = lambda i: fused_linear.silu_mul_linear(x, ws[i])  # noqa: E731
        with_cfg = lambda i: on_gemv(fused_linear.silu_mul_linear_with_config, x, ws[i], cfg)  # noqa: E731
        ref = fused_linear.silu_mul_linear_ref(x.float(), ws[0].float())
    else:
        fn = lambda i: linear.linear(x, ws[i])  # noqa: E731
        with_cfg = lambda i: on_gemv(linear.linear_with_config, x, ws[i], cfg)  # noqa: E731
        ref = linear.linear_ref(x.float(), ws[0].float())
    return nbytes, copies, fn, ref, with_cfg if cfg is not None else fn


def glu_case(n2: int, k: int, m: int, cfg: SkinnyConfig | None = None):
    """gate|up then SwiGLU on m normalised rows as the MLP dispatches it (the epilogue where
    mlp.glu_config gives a tiling, else gate|up and silu_and_mul); with cfg, "after" is the epilogue
    at that tiling."""
    nbytes, copies, ws = cases.rotated_weights(n2, k)
    x = torch.randn(m, k, device=cases.DEVICE).to(cases.DTYPE)
    down = (k, n2 // 2)

    def fn(i: int) -> torch.Tensor:
        glu = mlp.glu_config(m, (n2, k), down, tuning.tables_for(x.device))
        if glu is None:
            return activation.silu_and_mul(linear.linear(x, ws[i]))
        return mlp.swiglu_linear_with_config(x, ws[i], glu)

    with_cfg = lambda i: mlp.swiglu_linear_with_config(x, ws[i], cfg)  # noqa: E731
    ref = activation.silu_and_mul_ref(linear.linear_ref(x.float(), ws[0].float()))
    return nbytes, copies, fn, ref, with_cfg if cfg is not None else fn


def tma_case(n: int, k: int, m: int, glu: bool, cfg: SkinnyConfig | None = None):
    """The projection (glu: gate|up then SwiGLU, as glu_case) as dispatched; with cfg (tma=1), "after"
    runs that config. kernel_ab's switch turns TMA off for "before"."""
    return glu_case(n, k, m, cfg) if glu else proj_case(n, k, m, False, cfg)


def fused_case(n: int, k: int, m: int, swiglu: bool, cfg: SkinnyConfig):
    """The fused kernel (NORM or SWIGLU prologue) at cfg on both sides: only the switch differs."""
    nbytes, copies, ws = cases.rotated_weights(n, k)
    if swiglu:
        x = torch.randn(m, 2 * k, device=cases.DEVICE).to(cases.DTYPE)
        fn = lambda i: fused_linear.silu_mul_linear_with_config(x, ws[i], cfg)  # noqa: E731
        return nbytes, copies, fn, fused_linear.silu_mul_linear_ref(x.float(), ws[0].float()), fn
    nbytes, copies, _, ref, with_cfg = norm_case(n, k, m, cfg)
    return nbytes, copies, with_cfg, ref, with_cfg


def rope_attention_case(batch: int, ctx: int):
    """One decode step's QK-norm + RoPE + KV store, then the paged attention over ctx cached rows and
    the new one, at `batch` sequences, both as dispatched (PDL: the attention launches while the
    store drains). Bytes: the KV the attention reads; caches rotated so L2 does not serve them."""
    g = cases.ATTN_GEOMETRY
    hq, hkv, d, page = g["hq"], g["hkv"], g["d"], g["page"]
    _, kc, vc, bt, seq_lens, _ = cases.paged_case(batch, ctx, 1, **g)
    nbytes = 2 * batch * (ctx + 1) * hkv * d * kc.element_size()
    copies = max(1, min(64, math.ceil(cases.ROTATE_BYTES / nbytes)))
    caches = [(kc, vc)] + [(kc.clone(), vc.clone()) for _ in range(copies - 1)]
    qkv = torch.randn(batch, (hq + 2 * hkv) * d, device=cases.DEVICE).to(cases.DTYPE)
    q, k, v = qkv[:, : hq * d].view(batch, hq, d), *qkv[:, hq * d :].view(batch, 2, hkv, d).unbind(1)
    positions = torch.full((batch,), ctx, dtype=torch.long, device=cases.DEVICE)
    slots = bt[:, ctx // page].long() * page + ctx % page
    qn, kn = (torch.rand(d, device=cases.DEVICE).add_(0.5).to(cases.DTYPE) for _ in range(2))
    cos_sin = rope.rope_cos_sin(ctx + 1, d, 1e6, cases.DEVICE)
    qsl = torch.arange(batch + 1, dtype=torch.int32, device=cases.DEVICE)
    meta, scale = (bt, seq_lens, qsl, 1), d**-0.5

    def fn(i: int) -> torch.Tensor:
        kc_i, vc_i = caches[i]
        q_rot = rope.qk_norm_rope_store(q, k, v, positions, slots, qn, kn, cos_sin, kc_i, vc_i, EPS)
        return attention.paged_attention(q_rot, kc_i, vc_i, *meta, scale)

    kf, vf = kc.float(), vc.float()
    q_ref = rope.qk_norm_rope_store_ref(
        q.float(), k.float(), v.float(), positions, slots, qn.float(), kn.float(), cos_sin, kf, vf, EPS
    )
    return nbytes, copies, fn, attention.paged_attention_ref(q_ref, kf, vf, *meta, scale), fn
