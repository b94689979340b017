"""RMSNorm, residual add + RMSNorm, and the fused q/k norm + RoPE + KV-cache store against their torch
references (setup and tolerance policy: tests/kernel_helpers.py)."""

from __future__ import annotations

import pytest
import torch

from engine.kernels import _triton, linear, norm, rope, rotary
from tests.kernel_helpers import (
    DEV,
    DTYPES,
    POISON_INT,
    TOL,
    capture_graph,
    gpu,
    poison_empty,  # noqa: F401 (autouse: every torch.empty is poisoned)
    randn,
    rel_err,
)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(0, 64), (1, 64), (5, 300), (2, 3, 96), (3, 2560)])
def test_rms_norm(dtype, shape):
    torch.manual_seed(0)
    x, w = randn(*shape, dtype=dtype, scale=3.0), randn(shape[-1], dtype=dtype)
    out, ref = norm.rms_norm(x, w, 1e-6), norm.rms_norm_ref(x, w, 1e-6)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    if x.numel():
        assert rel_err(out, ref) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(0, 64), (4, 256), (2, 3, 100)])
def test_add_rms_norm(dtype, shape):
    torch.manual_seed(1)
    x, r, w = randn(*shape, dtype=dtype), randn(*shape, dtype=dtype), randn(shape[-1], dtype=dtype)
    out, summed = norm.add_rms_norm(x, r, w, 1e-5)
    ref, ref_sum = norm.add_rms_norm_ref(x, r, w, 1e-5)
    assert torch.equal(summed, ref_sum)
    if x.numel():
        assert rel_err(out, ref) < TOL[dtype]


def test_rms_norm_strided_rows():
    torch.manual_seed(2)
    wide = randn(6, 200)
    x, w = wide[:, 40:168], randn(128)  # rows of a wider buffer: stride 200
    assert rel_err(norm.rms_norm(x, w, 1e-6), norm.rms_norm_ref(x, w, 1e-6)) < TOL[torch.float32]


# --- qk norm + rope + store ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hq,hkv,d", [(4, 2, 32), (2, 2, 16), (4, 1, 64), (8, 2, 32)])
@pytest.mark.parametrize("with_q", [True, False])
def test_qk_norm_rope_store(dtype, hq, hkv, d, with_q):
    torch.manual_seed(3)
    t, page, blocks = 9, 16, 4
    qkv = randn(t, (hq + 2 * hkv) * d, dtype=dtype, scale=2.0)  # fused projection: strided views
    q = qkv[:, : hq * d].view(t, hq, d)
    k = qkv[:, hq * d : (hq + hkv) * d].view(t, hkv, d)
    v = qkv[:, (hq + hkv) * d :].view(t, hkv, d)
    positions = torch.randint(0, 100, (t,), device=DEV)
    slots = torch.tensor([0, -1, 15, 16, 17, 31, -1, 47, 63], device=DEV)  # page boundaries, skips
    cos_sin = rotary.rope_cos_sin(128, d, 1e6, DEV)
    qw, kw = randn(d, dtype=dtype), randn(d, dtype=dtype)
    caches = [torch.full((blocks, page, hkv, d), float("nan"), dtype=dtype, device=DEV) for _ in range(4)]
    kc, vc, kc_ref, vc_ref = caches
    args = (positions, slots, qw if with_q else None, kw, cos_sin)
    q_out = rope.qk_norm_rope_store(q if with_q else None, k, v, *args, kc, vc, 1e-6)
    q_ref = rope.qk_norm_rope_store_ref(q if with_q else None, k, v, *args, kc_ref, vc_ref, 1e-6)
    if with_q:
        assert q_out.is_contiguous() and q_out.dtype == q_ref.dtype
        assert rel_err(q_out, q_ref) < TOL[dtype]
    else:
        assert q_out is None
    assert torch.equal(kc.isnan(), kc_ref.isnan()), "written slots differ (slot -1 must be skipped)"
    written = ~kc_ref.isnan()
    assert rel_err(kc[written], kc_ref[written]) < TOL[dtype]
    assert torch.equal(vc.nan_to_num(POISON_INT), vc_ref.nan_to_num(POISON_INT))


def test_qk_norm_rope_store_empty():
    kc = torch.zeros(2, 16, 2, 32, device=DEV)
    k = randn(0, 2, 32)
    cs = rotary.rope_cos_sin(16, 32, 1e4, DEV)
    empty = torch.zeros(0, dtype=torch.int64, device=DEV)
    out = rope.qk_norm_rope_store(randn(0, 4, 32), k, k, empty, empty, randn(32), randn(32), cs, kc, kc, 1e-6)
    assert out.shape == (0, 4, 32)


@gpu
@pytest.mark.parametrize("rows", [1, 8, 64])
def test_gpu_early_inputs_change_no_output(rows, monkeypatch):
    """The step's inputs read before the PDL wait, right after the q|k|v projection that writes the
    rows it norms: eagerly and replayed from a graph, q and the caches are bit-identical to launches
    without PDL."""
    torch.manual_seed(5)
    hq, hkv, d, page = 32, 8, 128, 16
    x = randn(rows, 2560, dtype=torch.bfloat16)
    w_qkv = randn((hq + 2 * hkv) * d, 2560, dtype=torch.bfloat16, scale=0.02)
    positions = torch.randint(0, 4000, (rows,), device=DEV)
    slots = torch.randperm(rows * 4, device=DEV)[:rows]
    cos_sin = rotary.rope_cos_sin(4096, d, 1e6, DEV)
    qw, kw = randn(d, dtype=torch.bfloat16), randn(d, dtype=torch.bfloat16)
    outs = []
    for limit in (-1, _triton.PDL_MAX_ROWS):  # -1: no launch with PDL
        monkeypatch.setattr(_triton, "PDL_MAX_ROWS", limit)
        kc, vc = (torch.zeros(rows * 4 // page + 1, page, hkv, d, dtype=torch.bfloat16, device=DEV) for _ in range(2))

        def run(kc=kc, vc=vc):
            qkv = linear.linear(x, w_qkv)
            q, k, v = qkv[:, : hq * d], qkv[:, hq * d : (hq + hkv) * d], qkv[:, (hq + hkv) * d :]
            views = (t.view(rows, -1, d) for t in (q, k, v))
            return rope.qk_norm_rope_store(*views, positions, slots, qw, kw, cos_sin, kc, vc, 1e-6)

        graph, q_graph = capture_graph(run)
        kc.zero_(), vc.zero_()
        graph.replay()
        torch.cuda.synchronize()
        outs.append((q_graph.clone(), kc.clone(), vc.clone(), run().clone()))
    (q0, k0, v0, e0), (q1, k1, v1, e1) = outs
    assert torch.equal(q0, q1) and torch.equal(k0, k1) and torch.equal(v0, v1)
    assert torch.equal(e0, e1) and torch.equal(q0, e0)
