"""The deferred split-K reduce (split_sum.SplitSum): a split-K o or SwiGLU->down hands back its fp32
partials and the next add + RMSNorm sums them (the NORM prologue at one row, norm.add_rms_norm
above). The sum must be the reduce kernel's bit for bit (same fp32 adds in split order, same
rounding); through two decoder layers the deferred dispatch matches the reduce kernels' dispatch bit
for bit under the interpreter and to a quarter of the tolerance compiled, where the two GEMVs may
contract FMAs differently (setup and tolerance policy: tests/kernel_helpers.py)."""

from __future__ import annotations

import pytest
import torch

from engine.fixture.known.geometry import QWEN3_4B as QWEN3_4B_CONFIG
from engine.kernels import fused_linear, gemm, get_ops, linear, norm
from engine.kernels.rotary import rope_cos_sin
from engine.kernels.split_sum import SplitSum, dense
from engine.kernels.tuning import SkinnyConfig, TunedTables
from engine.models.config import Geometry
from engine.models.layers import decoder_layer
from tests.kernel_helpers import (
    DEV,
    DTYPES,
    INTERPRET,
    TOL,
    capture_graph,
    gpu,
    layer_inputs,
    norm_linear_ref,
    poison_empty,  # noqa: F401 (autouse: every torch.empty is poisoned)
    randn,
    record_launches,
    rel_err,
    small_geometry,
    use_tables,
)

SPLITS = [
    SkinnyConfig(1, 16, 64, 2, 4, 1),
    SkinnyConfig(1, 16, 64, 4, 4, 2),  # split 4 over 300 columns: a ragged last split
    SkinnyConfig(1, 8, 128, 4, 4, 1),  # split 4 over 3 tiles: an empty split adds zeros
]
NORM_GEMV = SkinnyConfig(1, 16, 64, 1, 4, 2)  # the consumer: the early-weights GEMV, K not a tile multiple


def producers(k: int, n: int, dtype: torch.dtype):
    """(name, x, weight, with_config) for o-like and SwiGLU->down-like products of n columns."""
    w = randn(n, k, dtype=dtype, scale=0.1)
    yield "linear", randn(1, k, dtype=dtype), w, linear.linear_with_config
    yield "swiglu", randn(1, 2 * k, dtype=dtype, scale=2.0), w, fused_linear.silu_mul_linear_with_config


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cfg", SPLITS, ids=str)
def test_split_sum_into_the_norm_prologue_is_the_reduce_bit_for_bit(dtype, cfg, monkeypatch):
    monkeypatch.setattr(gemm, "EARLY_WEIGHTS", gemm.PROLOGUES)  # both sides' producer on one kernel
    torch.manual_seed(60)
    k, n, out_n = 300, 80, 48
    r, nw, w2 = randn(1, n, dtype=dtype), randn(n, dtype=dtype).abs().add(0.5), randn(out_n, n, dtype=dtype, scale=0.1)
    for name, x, w, with_config in producers(k, n, dtype):
        parts = with_config(x, w, cfg, defer=True)
        assert isinstance(parts, SplitSum) and parts.shape == (1, n) and parts.dtype == dtype, name
        assert parts.parts.shape == (cfg.split_k, 1, n) and parts.parts.dtype == torch.float32
        summed_once = with_config(x, w, cfg)  # the reduce kernel's output
        assert torch.equal(parts.tensor(), summed_once) and torch.equal(dense(parts), summed_once), name
        y, s = fused_linear.add_rms_norm_linear_with_config(parts, r, nw, 1e-6, w2, NORM_GEMV)
        y0, s0 = fused_linear.add_rms_norm_linear_with_config(summed_once, r, nw, 1e-6, w2, NORM_GEMV)
        assert torch.equal(s, s0) and torch.equal(y, y0), name
        ref, ref_sum = norm_linear_ref(summed_once, r, nw, 1e-6, w2)
        assert torch.equal(s, ref_sum) and rel_err(y, ref) < TOL[dtype], name
        normed, s1 = norm.add_rms_norm(parts, r, nw, 1e-6)  # the final norm's consumer
        assert torch.equal(s1, s0) and torch.equal(normed, norm.add_rms_norm(summed_once, r, nw, 1e-6)[0])


def test_split_sum_is_summed_first_where_the_prologue_cannot_take_it(monkeypatch):
    """On the wait-first GEMV and at a split-K or multi-row consumer config, the partials go through
    the reduce kernel first: same results."""
    torch.manual_seed(61)
    k, n = 256, 64
    x, w = randn(1, k), randn(n, k, scale=0.1)
    r, nw, w2 = randn(1, n), randn(n).abs().add(0.5), randn(32, n, scale=0.1)
    parts = linear.linear_with_config(x, w, SPLITS[0], defer=True)
    want = fused_linear.add_rms_norm_linear_with_config(parts.tensor(), r, nw, 1e-6, w2, NORM_GEMV)
    monkeypatch.setattr(gemm, "EARLY_WEIGHTS", frozenset())
    got = fused_linear.add_rms_norm_linear_with_config(parts, r, nw, 1e-6, w2, NORM_GEMV)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    dot = SkinnyConfig(16, 16, 64, 1, 4, 1)
    got = fused_linear.add_rms_norm_linear_with_config(parts, r, nw, 1e-6, w2, dot)
    assert all(rel_err(a, b) < TOL[torch.float32] for a, b in zip(got, want, strict=True))


def test_defer_hands_back_partials_for_split_k_up_to_the_row_bound(monkeypatch):
    torch.manual_seed(62)
    x1, x4, w = randn(1, 256), randn(4, 256), randn(64, 256, scale=0.1)
    assert isinstance(linear.linear_with_config(x1, w, SPLITS[0], defer=True), SplitSum)
    whole = SkinnyConfig(1, 16, 64, 1, 4, 1)
    assert isinstance(linear.linear_with_config(x1, w, whole, defer=True), torch.Tensor)
    rows = SkinnyConfig(16, 16, 64, 2, 4, 1)
    assert isinstance(linear.linear_with_config(x4, w, rows, defer=True), torch.Tensor)  # one row only
    monkeypatch.setattr(gemm, "DEFER_MAX_ROWS", 4)
    assert isinstance(linear.linear_with_config(x4, w, rows, defer=True), SplitSum)
    assert isinstance(linear.linear_with_config(x4, w, rows), torch.Tensor)  # not asked to defer
    monkeypatch.setattr(gemm, "DEFER_MAX_ROWS", 0)
    assert isinstance(linear.linear_with_config(x1, w, SPLITS[0], defer=True), torch.Tensor)


ROW_SPLITS = [SkinnyConfig(16, 16, 64, 2, 4, 2), SkinnyConfig(16, 32, 64, 4, 4, 1)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cfg", ROW_SPLITS, ids=str)
@pytest.mark.parametrize("m", [3, 16])
def test_multi_row_split_sum_into_add_rms_norm_is_the_reduce_bit_for_bit(dtype, cfg, m, monkeypatch):
    """Deferred above one row (gemm.DEFER_MAX_ROWS raised) the consumer is norm.add_rms_norm (then the
    projection): it sums the partials in its own pass, with the reduce kernel's bits, for the tl.dot
    producers (plain and SwiGLU)."""
    monkeypatch.setattr(gemm, "DEFER_MAX_ROWS", 16)
    torch.manual_seed(65)
    k, n = 300, 80
    w, r, nw = randn(n, k, dtype=dtype, scale=0.1), randn(m, n, dtype=dtype), randn(n, dtype=dtype).abs().add(0.5)
    for name, x, with_config in (
        ("linear", randn(m, k, dtype=dtype), linear.linear_with_config),
        ("swiglu", randn(m, 2 * k, dtype=dtype, scale=2.0), fused_linear.silu_mul_linear_with_config),
    ):
        parts = with_config(x, w, cfg, defer=True)
        assert isinstance(parts, SplitSum) and parts.parts.shape == (cfg.split_k, m, n), name
        summed_once = with_config(x, w, cfg)
        assert torch.equal(parts.tensor(), summed_once), name
        normed, s = norm.add_rms_norm(parts, r, nw, 1e-6)
        normed0, s0 = norm.add_rms_norm(summed_once, r, nw, 1e-6)
        assert torch.equal(s, s0) and torch.equal(normed, normed0), name
        assert normed.shape == s.shape == (m, n)


def test_a_split_sum_of_another_dtype_is_summed_first(monkeypatch):
    """A SplitSum whose dtype differs from the residual's goes through the reduce kernel (the
    in-pass sum rounds to the residual's dtype): the reference's promotion holds."""
    monkeypatch.setattr(gemm, "DEFER_MAX_ROWS", 4)
    torch.manual_seed(66)
    parts = linear.linear_with_config(randn(4, 128), randn(32, 128, scale=0.1), ROW_SPLITS[0], defer=True)
    r, nw = randn(4, 32, dtype=torch.float16), randn(32).abs().add(0.5)
    normed, s = norm.add_rms_norm(parts, r, nw, 1e-6)
    normed0, s0 = norm.add_rms_norm(parts.tensor(), r, nw, 1e-6)
    assert s.dtype == torch.float32 and torch.equal(s, s0) and torch.equal(normed, normed0)


def two_layers(ops, g, w, meta, cache, x, residual, positions, cos_sin):
    """Two decoder layers on one set of weights and caches: the second consumes the first's
    mlp_out as the engine does (a SplitSum where the first deferred its down's reduce)."""
    caches = [(cache.clone(), cache.clone()) for _ in range(2)]
    h, res = x, residual
    for kc, vc in caches:
        h, res = decoder_layer(ops, g, w, h, res, positions, meta, kc, vc, cos_sin)
    return dense(h), res, caches


@pytest.mark.parametrize("rows", [1, 3])
def test_decoder_layers_defer_both_reduces_and_stay_bit_identical(monkeypatch, rows):
    """With split-K configs for o and down (this tiny geometry's tables), two Triton decoder layers
    give the same bits with the reduces deferred as with the reduce kernels, and the deferral
    happens (o and down hand back SplitSums): at one row into the NORM-prologue GEMV, at three
    (tl.dot producers, down unfused; deferral let up to four rows) into norm.add_rms_norm."""
    monkeypatch.setattr(gemm, "DEFER_MAX_ROWS", 4)
    torch.manual_seed(63)
    g = small_geometry()
    o_shape, down_shape = (g.hidden_size, g.q_size), (g.hidden_size, g.intermediate_size)
    linear_table = {
        o_shape: {1: SkinnyConfig(1, 16, 16, 4, 4, 1), 4: SkinnyConfig(16, 16, 16, 4, 4, 1)},
        down_shape: {4: SkinnyConfig(16, 32, 32, 2, 4, 2)},
    }
    tables = TunedTables(
        device="test", linear=linear_table, silu_mul_linear={down_shape: {1: SkinnyConfig(1, 16, 32, 2, 4, 2)}}
    )
    use_tables(monkeypatch, tables)
    w, meta, cache, x, residual, positions = layer_inputs(g, rows, ctx=40, dtype=torch.float16)
    ops, cos_sin = get_ops("triton"), rope_cos_sin(256, g.head_dim, g.rope_theta, DEV)
    deferred = record_launches(monkeypatch)
    after = two_layers(ops, g, w, meta, cache, x, residual, positions, cos_sin)
    assert sum(isinstance(y, SplitSum) for y in deferred) == 4  # o and down in each layer
    monkeypatch.setattr(gemm, "DEFER_MAX_ROWS", 0)
    before = two_layers(ops, g, w, meta, cache, x, residual, positions, cos_sin)
    if INTERPRET:
        assert torch.equal(after[0], before[0]) and torch.equal(after[1], before[1])
    for (kc, vc), (kc0, vc0) in zip(after[2], before[2], strict=True):
        assert torch.equal(kc, kc0) and torch.equal(vc, vc0)
    assert INTERPRET or all(rel_err(a, b) < TOL[torch.float16] / 4 for a, b in zip(after[:2], before[:2], strict=True))
    torch_out = two_layers(get_ops("torch"), g, w, meta, cache, x, residual, positions, cos_sin)
    assert rel_err(after[0], torch_out[0]) < 10 * TOL[torch.float16]


@gpu
@pytest.mark.parametrize("rows", [1, 8])
def test_gpu_4b_layers_defer_in_a_graph(monkeypatch, rows):
    """Two Qwen3-4B decoder layers at one and eight rows in bf16, as this device dispatches them,
    replayed from a CUDA graph with PDL: the deferred partials (read by the next kernel after its
    wait) give what the same dispatch gives launched one by one, and the reduce kernels' dispatch
    within TOL / 4."""
    monkeypatch.setattr(gemm, "DEFER_MAX_ROWS", rows)  # eight rows: deferral let up to them
    torch.manual_seed(64)
    g = Geometry.from_dict(QWEN3_4B_CONFIG, "test")
    w, meta, cache, x, residual, positions = layer_inputs(g, rows, ctx=200, dtype=torch.bfloat16)
    ops, cos_sin = get_ops("triton"), rope_cos_sin(4096, g.head_dim, g.rope_theta, "cuda")
    assert isinstance(ops.linear_to_residual(randn(rows, g.q_size, dtype=torch.bfloat16), w.o), SplitSum)
    eager = two_layers(ops, g, w, meta, cache, x, residual, positions, cos_sin)
    monkeypatch.setattr(gemm, "DEFER_MAX_ROWS", 0)
    before = two_layers(ops, g, w, meta, cache, x, residual, positions, cos_sin)
    monkeypatch.setattr(gemm, "DEFER_MAX_ROWS", rows)
    graph, after = capture_graph(lambda: two_layers(ops, g, w, meta, cache, x, residual, positions, cos_sin))
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(after[0], eager[0]) and torch.equal(after[1], eager[1])
        assert rel_err(after[0], before[0]) < TOL[torch.bfloat16] / 4
