"""The one-row projection kernel (gemv.py: first weight tile before the PDL wait, optionally the
next tile carried) against the references and the wait-first GEMV it replaces, with every prologue
(setup and tolerance policy: tests/kernel_helpers.py)."""

from __future__ import annotations

import pytest
import torch

from engine.kernels import fused_linear, gemm, linear, tuning
from engine.kernels.tuning import SkinnyConfig
from tests.kernel_helpers import (
    DTYPES,
    INTERPRET,
    QWEN3_4B,
    TOL,
    capture_graph,
    fused_ref,
    gpu,
    norm_linear_ref,
    poison_empty,  # noqa: F401 (autouse: every torch.empty is poisoned)
    randn,
    rel_err,
)

GEMV_CASES = [
    # n, k, config (num_stages >= 2: the next tile carried)
    (96, 256, SkinnyConfig(1, 32, 64, 1, 4, 2)),  # whole K, even, carried
    (96, 256, SkinnyConfig(1, 32, 64, 1, 4, 1)),  # whole K, even, one tile
    (40, 300, SkinnyConfig(1, 16, 64, 1, 4, 2)),  # ragged N and K
    (40, 300, SkinnyConfig(1, 8, 128, 1, 2, 1)),  # ragged, one tile
    (48, 64, SkinnyConfig(1, 16, 64, 1, 4, 2)),  # a single K tile: no loop iteration
    (40, 1000, SkinnyConfig(1, 32, 128, 4, 4, 2)),  # split-K, ragged K
    (40, 128, SkinnyConfig(1, 16, 64, 4, 4, 2)),  # split 4 over 2 tiles: two empty splits add zeros
    (40, 128, SkinnyConfig(1, 16, 64, 4, 4, 1)),
]


def both_paths(run, monkeypatch):
    """run() with the early-weights GEMV, then with the wait-first one."""
    monkeypatch.setattr(gemm, "EARLY_WEIGHTS", gemm.PROLOGUES)
    after = run()
    monkeypatch.setattr(gemm, "EARLY_WEIGHTS", frozenset())
    before = run()
    return after, before


def same(after: torch.Tensor, before: torch.Tensor, dtype: torch.dtype) -> bool:
    """Same products summed in the same order: bit for bit under the interpreter; compiled, the FMA
    contraction may differ."""
    return torch.equal(after, before) if INTERPRET else rel_err(after, before) < TOL[dtype] / 4


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k,cfg", GEMV_CASES)
def test_gemv_linear(dtype, n, k, cfg, monkeypatch):
    torch.manual_seed(40)
    x, w = randn(1, k, dtype=dtype), randn(n, k, dtype=dtype, scale=0.1)
    out, prev = both_paths(lambda: linear.linear_with_config(x, w, cfg), monkeypatch)
    assert out.shape == (1, n) and out.dtype == dtype
    assert rel_err(out, linear.linear_ref(x.float(), w.float())) < TOL[dtype]
    assert same(out, prev, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k,cfg", GEMV_CASES)
def test_gemv_silu_mul_linear(dtype, n, k, cfg, monkeypatch):
    torch.manual_seed(41)
    x, w = randn(1, 2 * k, dtype=dtype, scale=2.0), randn(n, k, dtype=dtype, scale=0.1)
    out, prev = both_paths(lambda: fused_linear.silu_mul_linear_with_config(x, w, cfg), monkeypatch)
    assert rel_err(out, fused_ref(x, w)) < TOL[dtype]
    assert same(out, prev, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k,cfg", [c for c in GEMV_CASES if c[2].split_k == 1])
def test_gemv_add_rms_norm_linear(dtype, n, k, cfg, monkeypatch):
    torch.manual_seed(42)
    x, r = randn(1, k, dtype=dtype, scale=2.0), randn(1, k, dtype=dtype)
    nw, w = randn(k, dtype=dtype), randn(n, k, dtype=dtype, scale=0.1)
    (y, summed), (y0, summed0) = both_paths(
        lambda: fused_linear.add_rms_norm_linear_with_config(x, r, nw, 1e-6, w, cfg), monkeypatch
    )
    ref, ref_sum = norm_linear_ref(x, r, nw, 1e-6, w)
    assert torch.equal(summed, ref_sum) and torch.equal(summed0, ref_sum)
    assert rel_err(y, ref) < TOL[dtype]
    assert same(y, y0, dtype)


# --- GPU only -----------------------------------------------------------------------------------


@gpu
def test_gpu_gemv_4b_as_dispatched(monkeypatch):
    """o (2560 x 4096) and SwiGLU -> down (2560 x 9728) at one row in bf16 as this device dispatches
    them, against the reference and the wait-first path; then replayed from a CUDA graph behind the
    Triton kernels that write x (with PDL, a read of x before the wait would see the previous inputs)."""
    torch.manual_seed(43)
    bf, h, inter, q = torch.bfloat16, QWEN3_4B["hidden"], QWEN3_4B["inter"], QWEN3_4B["hq"] * QWEN3_4B["d"]
    w_o, w_down = randn(h, q, dtype=bf, scale=0.05), randn(h, inter, dtype=bf, scale=0.05)
    t = tuning.tables_for(w_o.device)
    assert linear.skinny_config(1, h, q, t).block_m == 1 and fused_linear.silu_mul_linear_config(1, h, inter, t)
    x_o, x_gu = randn(1, q, dtype=bf), randn(1, 2 * inter, dtype=bf, scale=2.0)
    out, prev = both_paths(lambda: linear.linear(x_o, w_o), monkeypatch)
    assert rel_err(out, linear.linear_ref(x_o.float(), w_o.float())) < TOL[bf] and same(out, prev, bf)
    out, prev = both_paths(lambda: fused_linear.silu_mul_linear(x_gu, w_down), monkeypatch)
    assert rel_err(out, fused_ref(x_gu, w_down)) < TOL[bf] and same(out, prev, bf)
    w_in, w_gu, src = (
        randn(q, h, dtype=bf, scale=0.05),
        randn(2 * inter, h, dtype=bf, scale=0.05),
        randn(1, h, dtype=bf),
    )

    def chain():  # each projection reads what the Triton kernel before it wrote
        a = linear.linear(src, w_in)
        y = linear.linear(a, w_o)
        gu = linear.linear(src, w_gu)
        return a, y, gu, fused_linear.silu_mul_linear(gu, w_down)

    monkeypatch.setattr(gemm, "EARLY_WEIGHTS", gemm.PROLOGUES)  # both_paths left the wait-first path on
    graph, (a, y_o, gu, y_down) = capture_graph(chain)
    for _ in range(3):
        src.copy_(randn(1, h, dtype=bf))
        graph.replay()
        torch.cuda.synchronize()
        assert rel_err(y_o, linear.linear_ref(a.float(), w_o.float())) < TOL[bf]
        assert rel_err(y_down, fused_ref(gu, w_down)) < TOL[bf]
