"""The small kernels (SwiGLU activation, argmax, accept_prefix), the triton Ops table, and every
kernel at the Qwen3-4B shapes in bf16 on a GPU (setup and tolerance policy: tests/kernel_helpers.py)."""

from __future__ import annotations

import pytest
import torch

from engine.kernels import activation, fused_linear, get_ops, linear, mlp, norm, rope, rotary, sampling
from tests.kernel_helpers import (
    DEV,
    DTYPES,
    QWEN3_4B,
    TOL,
    gpu,
    poison_empty,  # noqa: F401 (autouse: every torch.empty is poisoned)
    randn,
    rel_err,
)

# --- activation, sampling -----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(0, 64), (3, 200), (2, 2, 2 * 1100)])
def test_silu_and_mul(dtype, shape):
    torch.manual_seed(10)
    x = randn(*shape, dtype=dtype, scale=3.0)
    out, ref = activation.silu_and_mul(x), activation.silu_and_mul_ref(x)
    assert out.shape == ref.shape
    if x.numel():
        assert rel_err(out, ref) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [7, 300, 5000, 151936])
def test_argmax(dtype, vocab):
    torch.manual_seed(11)
    logits = randn(4, vocab, dtype=dtype)
    logits[1] = torch.randint(0, 3, (vocab,), device=DEV).to(dtype)  # many ties: lowest index wins
    logits[2] = float("-inf")  # torch returns 0
    logits[3, vocab // 2 :] = logits[3].max() + 1  # tie spanning chunks
    assert torch.equal(sampling.argmax(logits), sampling.argmax_ref(logits))
    assert sampling.argmax(logits[:0]).shape == (0,)


def test_accept_prefix():
    torch.manual_seed(12)
    for n, k in [(0, 4), (6, 0), (9, 1), (33, 4), (5, 16)]:
        targets = torch.randint(0, 3, (n, k + 1), device=DEV)
        noise = torch.randint(0, 3, (n, k), device=DEV)
        drafts = torch.where(torch.rand(n, k, device=DEV) < 0.7, targets[:, :k], noise)
        limits = torch.randint(0, k + 1, (n,), device=DEV)
        if n:
            drafts[0], limits[0] = targets[0, :k], k  # full acceptance
        for lim in (limits, limits.int()):
            ref = sampling.accept_prefix_ref(drafts, targets, lim)
            assert torch.equal(sampling.accept_prefix(drafts, targets, lim), ref)


def test_triton_ops_fields():
    for inv in (False, True):
        ops = get_ops("triton", batch_invariant=inv)
        assert ops.name == "triton"
        assert ops.linear is (linear.linear_batch_invariant if inv else linear.linear)
        assert ops.silu_mul_linear is (
            fused_linear.silu_mul_linear_batch_invariant if inv else fused_linear.silu_mul_linear
        )
        want = fused_linear.add_rms_norm_linear_batch_invariant if inv else fused_linear.add_rms_norm_linear
        assert ops.add_rms_norm_linear is want
        assert (ops.mlp_to_residual is mlp.mlp_to_residual) is not inv
        assert ops.paged_attention.keywords == {"batch_invariant": inv}
        assert ops.argmax is sampling.argmax and ops.rms_norm is norm.rms_norm


# --- GPU only -----------------------------------------------------------------------------------


@gpu
def test_gpu_4b_shapes():
    torch.manual_seed(13)
    g, bf = QWEN3_4B, torch.bfloat16
    x, r, w = randn(8, g["hidden"], dtype=bf), randn(8, g["hidden"], dtype=bf), randn(g["hidden"], dtype=bf)
    assert rel_err(norm.add_rms_norm(x, r, w, 1e-6)[0], norm.add_rms_norm_ref(x, r, w, 1e-6)[0]) < TOL[bf]
    t = 9
    qkv = randn(t, (g["hq"] + 2 * g["hkv"]) * g["d"], dtype=bf)
    q, k, v = qkv.split([g["hq"] * g["d"], g["hkv"] * g["d"], g["hkv"] * g["d"]], dim=1)
    q, k, v = (z.view(t, -1, g["d"]) for z in (q, k, v))
    cs = rotary.rope_cos_sin(4096, g["d"], 1e6, DEV)
    pos, slots = torch.arange(100, 100 + t, device=DEV), torch.arange(t, device=DEV) * 7
    qw, kw = randn(g["d"], dtype=bf), randn(g["d"], dtype=bf)
    caches = [torch.zeros(8, 16, g["hkv"], g["d"], dtype=bf, device=DEV) for _ in range(4)]
    out = rope.qk_norm_rope_store(q, k, v, pos, slots, qw, kw, cs, caches[0], caches[1], 1e-6)
    ref = rope.qk_norm_rope_store_ref(q, k, v, pos, slots, qw, kw, cs, caches[2], caches[3], 1e-6)
    assert rel_err(out, ref) < TOL[bf] and rel_err(caches[0], caches[2]) < TOL[bf]
    for m in (1, 4, 16, 64):
        for n, kk in [(6144, 2560), (2560, 4096), (19456, 2560), (2560, 9728)]:
            xm, wm = randn(m, kk, dtype=bf), randn(n, kk, dtype=bf, scale=0.05)
            assert rel_err(linear.linear(xm, wm), linear.linear_ref(xm.float(), wm.float())) < TOL[bf], (m, n, kk)
    logits = randn(16, g["vocab"], dtype=bf)
    assert torch.equal(sampling.argmax(logits), sampling.argmax_ref(logits))
    h = randn(16, 2 * g["inter"], dtype=bf)
    assert rel_err(activation.silu_and_mul(h), activation.silu_and_mul_ref(h)) < TOL[bf]
