"""The fused projections against their references and the unfused pairs: SwiGLU + down
(`silu_mul_linear`) and residual add + RMSNorm + projection (`add_rms_norm_linear`), their dispatch
and batch-invariant variants (setup and tolerance policy: tests/kernel_helpers.py)."""

from __future__ import annotations

import pytest
import torch

from engine.kernels import activation, fused_linear, get_ops, linear, norm, tuning
from engine.kernels.tuning import SkinnyConfig, TunedTables
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
    row_invariant_dot,  # noqa: F401 (fixture, requested by name)
    use_tables,
)

# --- fused SwiGLU + down projection -------------------------------------------------------------


FUSED_CASES = [
    # m, n, inter (the down weight is [n, inter], the input [m, 2 inter]), config
    (1, 48, 200, SkinnyConfig(1, 16, 64, 1, 4, 2)),  # GEMV, I ragged against BLOCK_K
    (1, 40, 300, SkinnyConfig(1, 32, 128, 2, 4, 1)),  # GEMV, split-K, ragged I and N
    (3, 64, 200, SkinnyConfig(16, 32, 64, 2, 4, 2)),  # dot path, split-K, ragged I
    (16, 72, 160, SkinnyConfig(16, 32, 64, 1, 4, 2)),  # dot path, a full M tile, ragged N and I
    (16, 64, 256, SkinnyConfig(16, 64, 128, 4, 4, 2)),  # split 4 over 2 K tiles: empty splits add zeros
    (3, 50, 96, None),  # the default heuristic
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,inter,cfg", FUSED_CASES)
def test_silu_mul_linear(dtype, m, n, inter, cfg):
    torch.manual_seed(18)
    x, w = randn(m, 2 * inter, dtype=dtype, scale=2.0), randn(n, inter, dtype=dtype, scale=0.1)
    cfg = cfg or linear.default_skinny_config(m, n, inter)
    out = fused_linear.silu_mul_linear_with_config(x, w, cfg)
    assert out.shape == (m, n) and out.dtype == dtype
    assert rel_err(out, fused_ref(x, w)) < TOL[dtype]
    unfused = linear.linear_with_config(activation.silu_and_mul(x), w, cfg)
    if INTERPRET:  # same activation values, same products in the same order
        assert torch.equal(out, unfused)
    else:
        assert rel_err(out, unfused) < TOL[dtype] / 4


def test_silu_mul_linear_dispatch(monkeypatch):
    torch.manual_seed(19)
    n, inter = 40, 96
    w = randn(n, inter, scale=0.1)
    calls = []
    real_fused = fused_linear.silu_mul_linear_with_config
    spy = lambda x, w, cfg, defer=False: calls.append(cfg) or real_fused(x, w, cfg, defer)
    monkeypatch.setattr(fused_linear, "silu_mul_linear_with_config", spy)

    def check(shape, fused_cfg):
        calls.clear()
        x = randn(*shape[:-1], 2 * inter, scale=2.0)
        out = fused_linear.silu_mul_linear(x, w)
        assert out.shape == (*shape[:-1], n)
        assert calls == ([fused_cfg] if fused_cfg else []), (shape, calls)
        if x.numel():
            assert rel_err(out, fused_ref(x.reshape(-1, 2 * inter), w).view(out.shape)) < TOL[torch.float32]

    use_tables(monkeypatch, tuning.DEFAULT)  # untuned: fused up to fused_m_max rows at the down config
    check((1, inter), linear.default_skinny_config(1, n, inter))
    check((2, 2, inter), linear.default_skinny_config(4, n, inter))
    check((5, inter), None)
    check((0, inter), None)
    # The down shape tuned for linear only: the fused kernel takes its config, where it has one.
    down = {1: SkinnyConfig(1, 16, 32, 2, 4, 1), 2: SkinnyConfig(16, 16, 32, 1, 4, 2)}
    use_tables(monkeypatch, TunedTables("test", linear={(n, inter): down}))
    check((1, inter), down[1])
    check((2, inter), down[2])
    check((3, inter), None)  # cuBLAS bucket for the down projection: unfused
    # A fused table overrides: its buckets only, at its configs.
    fused = {1: SkinnyConfig(1, 32, 64, 1, 4, 1), 8: SkinnyConfig(16, 32, 64, 2, 4, 2)}
    use_tables(monkeypatch, TunedTables("test", linear={(n, inter): down}, silu_mul_linear={(n, inter): fused}))
    check((1, inter), fused[1])
    check((2, inter), None)
    check((7, inter), fused[8])
    check((9, inter), None)
    assert fused_linear.silu_mul_linear_config(1, n, inter, TunedTables("t", fused_m_max=0)) is None


@pytest.mark.usefixtures("row_invariant_dot")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_silu_mul_linear_batch_invariant(dtype):
    torch.manual_seed(20)
    n, inter = 80, 200
    x, w = randn(64, 2 * inter, dtype=dtype, scale=2.0), randn(n, inter, dtype=dtype, scale=0.1)
    full = fused_linear.silu_mul_linear_batch_invariant(x, w)
    assert rel_err(full, fused_ref(x, w)) < TOL[dtype]
    for rows in (1, 3, 16):
        assert torch.equal(fused_linear.silu_mul_linear_batch_invariant(x[:rows], w), full[:rows]), rows
    assert torch.equal(fused_linear.silu_mul_linear_batch_invariant(x[9:10], w), full[9:10])


def test_ops_silu_mul_linear():
    """torch Ops: exactly the unfused reference pair (the CPU path is unchanged bit for bit)."""
    torch.manual_seed(21)
    x, w = randn(5, 2 * 48), randn(32, 48)
    for inv in (False, True):
        ops = get_ops("torch", batch_invariant=inv)
        assert torch.equal(ops.silu_mul_linear(x, w), ops.linear(activation.silu_and_mul_ref(x), w))
    assert get_ops("torch").silu_mul_linear is fused_linear.silu_mul_linear_ref


# --- fused residual add + RMSNorm + projection --------------------------------------------------


NORM_CASES = [
    # m, n, k (weight [n, k], rows [m, k]), config
    (1, 48, 200, SkinnyConfig(1, 16, 64, 1, 4, 2)),  # GEMV, K ragged against BLOCK_K
    (1, 40, 256, SkinnyConfig(1, 16, 64, 1, 4, 1)),  # GEMV, 3 N tiles: only N tile 0 writes the sum
    (3, 64, 200, SkinnyConfig(16, 32, 64, 1, 4, 2)),  # dot path, ragged K
    (16, 72, 160, SkinnyConfig(16, 32, 64, 1, 4, 2)),  # dot path, a full M tile, ragged N and K
    (20, 64, 128, SkinnyConfig(16, 32, 64, 1, 4, 2)),  # two M tiles (the second one ragged)
    (3, 50, 96, None),  # the default heuristic's config
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k,cfg", NORM_CASES)
def test_add_rms_norm_linear(dtype, m, n, k, cfg):
    torch.manual_seed(24)
    x, r = randn(m, k, dtype=dtype, scale=2.0), randn(m, k, dtype=dtype)
    nw, w = randn(k, dtype=dtype), randn(n, k, dtype=dtype, scale=0.1)
    cfg = cfg or linear.default_skinny_config(m, n, k)
    y, summed = fused_linear.add_rms_norm_linear_with_config(x, r, nw, 1e-6, w, cfg)
    ref, ref_sum = norm_linear_ref(x, r, nw, 1e-6, w)
    assert y.shape == (m, n) and y.dtype == dtype and summed.shape == (m, k)
    assert torch.equal(summed, ref_sum), "the residual sum is elementwise: it must match exactly"
    assert rel_err(y, ref) < TOL[dtype]
    # Against the unfused Triton pair at the same config: the differences are the order of the sum of
    # squares and where 1/rms is applied (to the accumulator, not to each element before the weight
    # product), so it agrees to the dtype's tolerance.
    normed, summed2 = norm.add_rms_norm(x, r, nw, 1e-6)
    assert torch.equal(summed, summed2)
    assert rel_err(y, linear.linear_with_config(normed, w, cfg)) < TOL[dtype]


def test_add_rms_norm_linear_refuses_split_k():
    x, cfg = randn(1, 64), SkinnyConfig(1, 8, 32, 2, 4, 1)
    with pytest.raises(ValueError, match="split_k 1"):
        fused_linear.add_rms_norm_linear_with_config(x, x, randn(64), 1e-6, randn(8, 64), cfg)


def test_add_rms_norm_linear_dispatch(monkeypatch):
    torch.manual_seed(25)
    n, k = 40, 96
    w, nw = randn(n, k, scale=0.1), randn(k)
    calls = []
    real = fused_linear.add_rms_norm_linear_with_config
    spy = lambda x, r, nw, eps, w, cfg: calls.append(cfg) or real(x, r, nw, eps, w, cfg)
    monkeypatch.setattr(fused_linear, "add_rms_norm_linear_with_config", spy)

    def check(shape, want_cfg):
        calls.clear()
        x, r = randn(*shape), randn(*shape)
        y, summed = fused_linear.add_rms_norm_linear(x, r, nw, 1e-5, w)
        assert y.shape == (*shape[:-1], n) and summed.shape == x.shape
        assert calls == ([want_cfg] if want_cfg else []), (shape, calls)
        if x.numel():
            ref, ref_sum = norm_linear_ref(x.reshape(-1, k), r.reshape(-1, k), nw, 1e-5, w)
            assert torch.equal(summed.reshape(-1, k), ref_sum)
            assert rel_err(y.reshape(-1, n), ref) < TOL[torch.float32]

    use_tables(monkeypatch, tuning.DEFAULT)  # fused at the projection's own (unsplit) config, one row
    check((1, k), linear.default_skinny_config(1, n, k))
    check((2, 2, k), None)  # above norm_m_max (1 by default): the unfused pair
    check((0, k), None)
    use_tables(monkeypatch, TunedTables("test", norm_m_max=16))
    check((16, k), linear.default_skinny_config(16, n, k))
    check((17, k), None)  # cuBLAS serves the projection: the unfused pair
    split = SkinnyConfig(16, 16, 32, 2, 4, 1)
    use_tables(monkeypatch, TunedTables("test", norm_m_max=16, linear={(n, k): {2: split}}))
    check((2, k), None)  # the projection splits K: the unfused pair
    cfgs = {1: SkinnyConfig(1, 16, 32, 1, 4, 1), 4: SkinnyConfig(16, 16, 32, 1, 4, 2), 8: split}
    use_tables(monkeypatch, TunedTables("test", add_rms_norm_linear={(n, k): cfgs}))
    check((1, k), cfgs[1])
    check((2, k), None)  # bucket 2 missing: the unfused pair
    check((3, k), cfgs[4])
    check((2, 2, k), cfgs[4])
    check((5, k), None)  # a split-K entry is not used
    use_tables(monkeypatch, TunedTables("test", norm_m_max=2))  # a file may cap it for untuned shapes
    check((2, k), linear.default_skinny_config(2, n, k))
    check((3, k), None)


@pytest.mark.usefixtures("row_invariant_dot")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_add_rms_norm_linear_batch_invariant(dtype):
    torch.manual_seed(26)
    n, k = 80, 200
    x, r = randn(64, k, dtype=dtype, scale=2.0), randn(64, k, dtype=dtype)
    nw, w = randn(k, dtype=dtype), randn(n, k, dtype=dtype, scale=0.1)
    full, summed = fused_linear.add_rms_norm_linear_batch_invariant(x, r, nw, 1e-6, w)
    ref, ref_sum = norm_linear_ref(x, r, nw, 1e-6, w)
    assert torch.equal(summed, ref_sum) and rel_err(full, ref) < TOL[dtype]
    for rows in (1, 3, 16):
        assert torch.equal(
            fused_linear.add_rms_norm_linear_batch_invariant(x[:rows], r[:rows], nw, 1e-6, w)[0], full[:rows]
        )


def test_ops_add_rms_norm_linear():
    """torch Ops: exactly add_rms_norm + linear (the CPU path is unchanged bit for bit)."""
    torch.manual_seed(27)
    x, r, nw, w = randn(5, 48), randn(5, 48), randn(48), randn(32, 48)
    for inv in (False, True):
        ops = get_ops("torch", batch_invariant=inv)
        normed, summed = ops.add_rms_norm(x, r, nw, 1e-6)
        y, summed2 = ops.add_rms_norm_linear(x, r, nw, 1e-6, w)
        assert torch.equal(y, ops.linear(normed, w)) and torch.equal(summed, summed2)
    assert get_ops("torch").add_rms_norm_linear is fused_linear.add_rms_norm_linear_ref


def unsplit(m: int, n: int, k: int) -> SkinnyConfig:
    return linear.default_skinny_config(m, n, k)._replace(split_k=1)


# --- GPU only -----------------------------------------------------------------------------------


@gpu
def test_gpu_silu_mul_linear_4b():
    """The fused SwiGLU + down op at the Qwen3-4B shape (2560 x 9728, bf16) as dispatched on this
    device (fused at small M, the unfused pair above), against the reference and the unfused pair;
    then captured in a CUDA graph and replayed on new inputs."""
    torch.manual_seed(23)
    bf, n, inter = torch.bfloat16, QWEN3_4B["hidden"], QWEN3_4B["inter"]
    w = randn(n, inter, dtype=bf, scale=0.05)
    t = tuning.tables_for(w.device)
    for m in (1, 2, 3, 4, 8, 16, 32, 64):
        x = randn(m, 2 * inter, dtype=bf, scale=2.0)
        ref = fused_ref(x, w)
        out = fused_linear.silu_mul_linear(x, w)
        assert rel_err(out, ref) < TOL[bf], m
        cfg = fused_linear.silu_mul_linear_config(m, n, inter, t) or linear.default_skinny_config(m, n, inter)
        fused = fused_linear.silu_mul_linear_with_config(x, w, cfg)
        assert rel_err(fused, ref) < TOL[bf], (m, cfg)
        assert rel_err(fused, linear.linear_with_config(activation.silu_and_mul(x), w, cfg)) < TOL[bf] / 4, (m, cfg)
    for m in (1, 4):
        x = randn(m, 2 * inter, dtype=bf, scale=2.0)
        # compiled + the tables loaded outside the capture
        graph, out = capture_graph(lambda x=x: fused_linear.silu_mul_linear(x, w))
        for _ in range(2):
            x.copy_(randn(m, 2 * inter, dtype=bf, scale=2.0))
            graph.replay()
            torch.cuda.synchronize()
            assert rel_err(out, fused_ref(x, w)) < TOL[bf], m


@gpu
@pytest.mark.parametrize("n", [6144, 19456])
def test_gpu_add_rms_norm_linear_4b(n):
    """The add + RMSNorm prologue at the Qwen3-4B q|k|v and gate|up shapes (bf16): at the table's
    config (or the default one) for M = 1..16 vs the reference (the residual sum exactly), the
    dispatched op, then a CUDA-graph capture replayed on new inputs."""
    torch.manual_seed(24)
    bf, k = torch.bfloat16, QWEN3_4B["hidden"]
    w, nw = randn(n, k, dtype=bf, scale=0.05), randn(k, dtype=bf)
    t = tuning.tables_for(w.device)
    for m in (1, 2, 3, 4, 8, 16):
        x, r = randn(m, k, dtype=bf, scale=2.0), randn(m, k, dtype=bf)
        ref, ref_sum = norm_linear_ref(x, r, nw, 1e-6, w)
        cfg = fused_linear.add_rms_norm_linear_config(m, n, k, t) or unsplit(m, n, k)
        y, summed = fused_linear.add_rms_norm_linear_with_config(x, r, nw, 1e-6, w, cfg)
        assert torch.equal(summed, ref_sum) and rel_err(y, ref) < TOL[bf], (m, cfg)
        y, summed = fused_linear.add_rms_norm_linear(x, r, nw, 1e-6, w)
        assert torch.equal(summed, ref_sum) and rel_err(y, ref) < TOL[bf], m
    for m in (1, 4):
        x, r = randn(m, k, dtype=bf, scale=2.0), randn(m, k, dtype=bf)
        cfg = unsplit(m, n, k)
        run = lambda x=x, r=r, cfg=cfg: fused_linear.add_rms_norm_linear_with_config(x, r, nw, 1e-6, w, cfg)
        graph, (y, summed) = capture_graph(run)
        for _ in range(2):
            x.copy_(randn(m, k, dtype=bf, scale=2.0))
            r.copy_(randn(m, k, dtype=bf))
            graph.replay()
            torch.cuda.synchronize()
            ref, ref_sum = norm_linear_ref(x, r, nw, 1e-6, w)
            assert torch.equal(summed, ref_sum) and rel_err(y, ref) < TOL[bf], m
