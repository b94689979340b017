"""The TMA GEMM (kernels/gemm_tma.py): plain, split-K and SwiGLU-epilogue projections against their
references and the tl.dot kernel it stands in for, which calls gemm.launch hands it (tma=1 configs),
and on the GPU
bf16 at the Qwen3-4B shapes, eagerly and from a graph (setup and tolerance policy:
tests/kernel_helpers.py)."""

from __future__ import annotations

import pytest
import torch

from engine.kernels import _triton, activation, fused_linear, gemm_tma, linear, mlp
from engine.kernels.split_sum import SplitSum, dense
from engine.kernels.tuning import SkinnyConfig
from tests.kernel_helpers import (
    DEV,
    DTYPES,
    QWEN3_4B,
    TOL,
    capture_graph,
    gpu,
    poison_empty,  # noqa: F401 (autouse: every torch.empty is poisoned)
    randn,
    rel_err,
)

CASES = [
    # m, n, k, config
    (16, 64, 128, SkinnyConfig(16, 64, 64, 1, 4, 2, tma=1)),
    (5, 96, 200, SkinnyConfig(16, 64, 64, 1, 4, 3, tma=1)),  # ragged M, N against BLOCK_N, K against BLOCK_K
    (33, 64, 256, SkinnyConfig(32, 64, 32, 4, 4, 2, tma=1)),  # two M tiles; split-K partials summed
    (20, 70, 192, SkinnyConfig(16, 64, 64, 2, 4, 2, tma=1)),  # split-K with a ragged N
    (40, 64, 320, SkinnyConfig(16, 64, 64, 3, 4, 2, tma=1)),  # three splits: 128, 128 and 64 columns
]
TMA_CFG = CASES[0][3]


@pytest.fixture
def tma_on(monkeypatch):
    """The TMA GEMM's launches (their configs) while the test runs."""
    launched = []
    real = gemm_tma.launch
    monkeypatch.setattr(gemm_tma, "launch", lambda *a, **kw: (launched.append(a[2]), real(*a, **kw))[1])
    return launched


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k,cfg", CASES)
def test_tma_linear_matches_reference_and_the_dot_kernel(tma_on, monkeypatch, dtype, m, n, k, cfg):
    torch.manual_seed(23)
    x, w = randn(m, k, dtype=dtype), randn(n, k, dtype=dtype, scale=0.2)
    out = linear.linear_with_config(x, w, cfg)
    assert tma_on == [cfg] and out.shape == (m, n) and out.dtype == dtype
    assert rel_err(out, linear.linear_ref(x.float(), w.float())) < TOL[dtype]
    assert rel_err(out, linear.linear_with_config(x, w, cfg._replace(tma=0))) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,inter,k,cfg", [(2, 64, 128, TMA_CFG), (33, 80, 96, SkinnyConfig(32, 64, 32, 1, 4, 2, 1))])
def test_tma_swiglu_epilogue_rounds_as_the_unfused_pair(tma_on, dtype, m, inter, k, cfg):
    torch.manual_seed(29)
    x, gate_up = randn(m, k, dtype=dtype), randn(2 * inter, k, dtype=dtype, scale=0.2)
    out = mlp.swiglu_linear_with_config(x, gate_up, cfg)
    assert tma_on == [cfg] and out.shape == (m, inter)
    ref = activation.silu_and_mul_ref(linear.linear_ref(x.float(), gate_up.float()).to(dtype))
    assert rel_err(out, ref) < TOL[dtype]


def test_a_deferred_split_hands_back_the_tma_partials(tma_on):
    x, w = randn(1, 256), randn(96, 256)
    cfg = SkinnyConfig(16, 64, 64, 4, 4, 2, tma=1)
    parts = linear.linear_with_config(x, w, cfg, defer=True)
    assert isinstance(parts, SplitSum) and parts.parts.shape == (4, 1, 96) and tma_on == [cfg]
    assert rel_err(dense(parts), linear.linear_ref(x, w)) < TOL[torch.float32]


def test_only_plain_projections_on_tma_configs_take_it(tma_on):
    x, w, r = randn(8, 128), randn(64, 128), randn(8, 128)
    linear.linear_with_config(x, w, TMA_CFG._replace(tma=0))
    assert tma_on == []
    linear.linear_with_config(x, w, TMA_CFG)
    assert tma_on == [TMA_CFG]
    fused_linear.add_rms_norm_linear_with_config(x, r, randn(128).abs(), 1e-6, w, TMA_CFG)  # a prologue: tl.dot
    fused_linear.silu_mul_linear_with_config(randn(8, 256), randn(64, 128), TMA_CFG)
    assert tma_on == [TMA_CFG]


def test_batch_invariant_mode_keeps_one_kernel_at_every_row_count(tma_on, monkeypatch):
    monkeypatch.setattr(linear, "INVARIANT_CONFIG", linear.INVARIANT_CONFIG._replace(block_n=64, tma=1))
    x, w = randn(40, 128), randn(64, 128)
    one = linear.linear_batch_invariant(x[:1], w)
    assert torch.equal(linear.linear_batch_invariant(x, w)[:1], one) and tma_on == []


def test_only_a_cuda_device_of_sm90_or_above_counts_as_one():
    assert not _triton.sm90(torch.device("cpu"))
    if torch.cuda.is_available():
        assert _triton.sm90(torch.device("cuda")) == (torch.cuda.get_device_capability() >= (9, 0))


def test_serves_refuses_what_tma_cannot_address():
    w = randn(64, 128)
    assert gemm_tma.serves(randn(8, 128), w, TMA_CFG)
    assert not gemm_tma.serves(randn(8, 128), w, SkinnyConfig(1, 16, 64, 1, 4, 2))  # the GEMV's config
    assert not gemm_tma.serves(randn(8, 129)[:, 1:], w, SkinnyConfig(16, 64, 64, 1, 4, 2))  # 4-byte base offset
    assert not gemm_tma.serves(randn(8, 130)[:, :128], w, SkinnyConfig(16, 64, 64, 1, 4, 2))  # 520-byte rows
    assert not gemm_tma.serves(randn(128, 8).t(), w, SkinnyConfig(16, 64, 64, 1, 4, 2))  # column-major


def test_a_misaligned_activation_falls_back_to_the_dot_kernel(tma_on):
    x, w = randn(8, 129)[:, 1:], randn(64, 128)
    out = linear.linear_with_config(x, w, TMA_CFG)
    assert tma_on == [] and rel_err(out, linear.linear_ref(x, w)) < TOL[torch.float32]


@gpu
@pytest.mark.parametrize("m", [16, 32, 64])
@pytest.mark.parametrize(
    "shape,cfg",
    [
        ((6144, 2560), SkinnyConfig(64, 64, 64, 1, 4, 4, 1)),
        ((2560, 9728), SkinnyConfig(64, 64, 128, 4, 4, 4, 1)),
        ((2560, 4096), SkinnyConfig(64, 128, 64, 2, 8, 3, 1)),
    ],
)
def test_tma_linear_bf16_at_4b_shapes_eager_and_from_a_graph(tma_on, m, shape, cfg):
    torch.manual_seed(31)
    (n, k), dtype = shape, torch.bfloat16
    x, w = randn(m, k, dtype=dtype), randn(n, k, dtype=dtype, scale=0.05)
    cfg = cfg._replace(block_m=min(cfg.block_m, max(16, m)))
    eager = linear.linear_with_config(x, w, cfg)
    assert rel_err(eager, linear.linear_ref(x.float(), w.float())) < TOL[dtype]
    graph, replayed = capture_graph(lambda: linear.linear_with_config(x, w, cfg))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(replayed, eager)


@gpu
@pytest.mark.parametrize("m", [16, 64])
def test_tma_swiglu_epilogue_bf16_at_the_4b_gate_up(tma_on, m):
    torch.manual_seed(37)
    inter, h = QWEN3_4B["inter"], QWEN3_4B["hidden"]
    x, gate_up = randn(m, h, dtype=torch.bfloat16), randn(2 * inter, h, dtype=torch.bfloat16, scale=0.05)
    out = mlp.swiglu_linear_with_config(x, gate_up, SkinnyConfig(min(m, 64), 64, 64, 1, 4, 4, 1))
    pair = activation.silu_and_mul(linear.linear_ref(x, gate_up))
    assert out.device.type == DEV and rel_err(out, pair) < TOL[torch.bfloat16]
