"""A split-K q|k|v hands its fp32 partials to QK-norm + RoPE + store (fused_linear.add_rms_norm_qkv),
which sums them as the reduce kernel would: same fp32 adds in split order from zero, same rounding,
so the deferred dispatch is the reduce's bit for bit, and no reduce is launched (setup and tolerance
policy: tests/kernel_helpers.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from engine.fixture.known.geometry import QWEN3_4B as QWEN3_4B_CONFIG
from engine.kernels import fused_linear, gemm, get_ops, linear, rope, tuning
from engine.kernels.rotary import rope_cos_sin
from engine.kernels.split_sum import SplitSum, reduce_parts
from engine.kernels.tuning import SkinnyConfig, TunedTables
from engine.models.config import Geometry
from engine.models.layers import decoder_layer, heads
from tests.kernel_helpers import (
    DEV,
    DTYPES,
    capture_graph,
    gpu,
    layer_inputs,
    poison_empty,  # noqa: F401 (autouse: every torch.empty is poisoned)
    randn,
    record_launches,
    small_geometry,
    use_tables,
)

HQ, HKV, D = 4, 2, 16
N = (HQ + 2 * HKV) * D


def rope_inputs(tokens: int, dtype: torch.dtype):
    """Positions, slots (one row not stored), norm weights, cos/sin and zeroed caches."""
    positions = torch.arange(5, 5 + tokens, device=DEV)
    slots = torch.arange(tokens, device=DEV) * 3
    slots[1] = -1
    qw, kw = randn(D, dtype=dtype).abs().add(0.5), randn(D, dtype=dtype).abs().add(0.5)
    cache = torch.zeros(8, 16, HKV, D, dtype=dtype, device=DEV)
    return positions, slots, qw, kw, rope_cos_sin(64, D, 1e6, DEV), cache


def columns(x):
    return heads(x, 0, HQ * D, D), heads(x, HQ * D, (HQ + HKV) * D, D), heads(x, (HQ + HKV) * D, N, D)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("splits", [2, 3])
@pytest.mark.parametrize("with_q", [True, False])
def test_rope_sums_the_partials_as_the_reduce_does_bit_for_bit(dtype, splits, with_q):
    torch.manual_seed(71)
    tokens = 5
    parts = randn(splits, tokens, N)
    parts[0, 0, :D] = -0.0  # a -0.0 partial: the reduce's sum from zero makes it +0.0
    positions, slots, qw, kw, cos_sin, cache = rope_inputs(tokens, dtype)
    summed = reduce_parts(parts, torch.empty(tokens, N, dtype=dtype, device=DEV))
    outs = []
    for qkv in (SplitSum(parts, dtype), summed):
        q, k, v = columns(qkv)
        kc, vc = cache.clone(), cache.clone()
        q_out = rope.qk_norm_rope_store(q if with_q else None, k, v, positions, slots, qw, kw, cos_sin, kc, vc, 1e-6)
        outs.append((q_out, kc, vc))
    (q1, kc1, vc1), (q0, kc0, vc0) = outs
    assert torch.equal(kc1, kc0) and torch.equal(vc1, vc0) and kc1.abs().sum() > 0
    assert (q1 is None and q0 is None) if not with_q else torch.equal(q1, q0)


def test_partials_of_another_dtype_than_the_caches_are_refused():
    parts = randn(2, 3, N)
    positions, slots, qw, kw, cos_sin, cache = rope_inputs(3, torch.float16)
    q, k, v = columns(SplitSum(parts, torch.float32))
    with pytest.raises(AssertionError, match="caches' dtype"):
        rope.qk_norm_rope_store(q, k, v, positions, slots, qw, kw, cos_sin, cache, cache.clone(), 1e-6)


def test_defer_rows_hands_back_partials_at_more_rows_than_the_one_row_bound():
    torch.manual_seed(72)
    x, w = randn(8, 256), randn(64, 256, scale=0.1)
    cfg = SkinnyConfig(16, 16, 64, 2, 4, 1)
    assert gemm.DEFER_MAX_ROWS == 1
    assert isinstance(linear.linear_with_config(x, w, cfg, defer=True), torch.Tensor)
    deferred = linear.linear_with_config(x, w, cfg, defer=True, defer_rows=8)
    assert isinstance(deferred, SplitSum) and deferred.parts.shape == (2, 8, 64)
    assert torch.equal(deferred.tensor(), linear.linear_with_config(x, w, cfg))
    assert isinstance(linear.linear_with_config(x, w, cfg, defer=True, defer_rows=4), torch.Tensor)


def layer(ops, g, w, meta, cache, x, residual, positions, cos_sin):
    kc, vc = cache.clone(), cache.clone()
    h, res = decoder_layer(ops, g, w, x, residual, positions, meta, kc, vc, cos_sin)
    return h, res, kc, vc


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_decoder_layer_defers_the_qkv_reduce_and_stays_bit_identical(monkeypatch, dtype):
    """With a split-K q|k|v config (this tiny geometry's table), a Triton decoder layer of three rows
    gives the same bits with the reduce deferred into QK-norm + RoPE + store as with the reduce
    kernel, and q|k|v did come back as partials."""
    torch.manual_seed(73)
    g = small_geometry()
    qkv_shape = (g.q_size + 2 * g.kv_size, g.hidden_size)
    use_tables(monkeypatch, TunedTables(device="test", linear={qkv_shape: {4: SkinnyConfig(16, 32, 32, 2, 4, 2)}}))
    w, meta, cache, x, residual, positions = layer_inputs(g, 3, ctx=40, dtype=dtype)
    ops, cos_sin = get_ops("triton"), rope_cos_sin(256, g.head_dim, g.rope_theta, DEV)
    launched = record_launches(monkeypatch)
    after = layer(ops, g, w, meta, cache, x, residual, positions, cos_sin)
    assert sum(isinstance(y, SplitSum) for y in launched) == 1
    monkeypatch.setattr(fused_linear, "QKV_DEFER_MAX_ROWS", 0)
    launched.clear()
    before = layer(ops, g, w, meta, cache, x, residual, positions, cos_sin)
    assert not any(isinstance(y, SplitSum) for y in launched)
    assert all(torch.equal(a, b) for a, b in zip(after, before, strict=True))


@gpu
@pytest.mark.parametrize("rows", [8, 64])
def test_gpu_4b_layer_defers_qkv_in_a_graph(monkeypatch, rows):
    """A Qwen3-4B decoder layer in bf16 with q|k|v on a TMA split-2 entry, replayed from a CUDA graph
    with PDL: the partials read by QK-norm + RoPE + store after its wait give the reduce kernel's
    bits."""
    torch.manual_seed(74)
    g = Geometry.from_dict(QWEN3_4B_CONFIG, "test")
    qkv_shape = (g.q_size + 2 * g.kv_size, g.hidden_size)
    shipped = tuning.tables_for(torch.device("cuda"))
    entry = {rows: SkinnyConfig(max(16, rows), 64, 64, 2, 4, 5, 1)}  # the split-2 TMA entry, as shipped
    qkv_entries = {**shipped.linear.get(qkv_shape, {}), **entry}  # a card without a tuned table: defaults
    use_tables(monkeypatch, replace(shipped, linear={**shipped.linear, qkv_shape: qkv_entries}))
    w, meta, cache, x, residual, positions = layer_inputs(g, rows, ctx=200, dtype=torch.bfloat16)
    ops, cos_sin = get_ops("triton"), rope_cos_sin(4096, g.head_dim, g.rope_theta, "cuda")
    launched = record_launches(monkeypatch)
    eager = layer(ops, g, w, meta, cache, x, residual, positions, cos_sin)
    assert any(isinstance(y, SplitSum) and y.parts.shape[1:] == (rows, qkv_shape[0]) for y in launched)
    monkeypatch.setattr(fused_linear, "QKV_DEFER_MAX_ROWS", 0)
    before = layer(ops, g, w, meta, cache, x, residual, positions, cos_sin)
    monkeypatch.setattr(fused_linear, "QKV_DEFER_MAX_ROWS", 64)
    graph, after = capture_graph(lambda: layer(ops, g, w, meta, cache, x, residual, positions, cos_sin))
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(a, b) for a, b in zip(after, eager, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(eager, before, strict=True))
