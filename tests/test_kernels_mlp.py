"""The MLP op (kernels/mlp.py): gate|up with the SwiGLU epilogue against its reference and the unfused
pair it replaces, which rows take it, and the whole op against the torch backend's (setup and
tolerance policy: tests/kernel_helpers.py)."""

from __future__ import annotations

import pytest
import torch

from engine.kernels import activation, get_ops, linear, mlp, norm
from engine.kernels.split_sum import dense
from engine.kernels.tuning import SkinnyConfig, TunedTables
from tests.kernel_helpers import (
    DTYPES,
    QWEN3_4B,
    TOL,
    capture_graph,
    gpu,
    poison_empty,  # noqa: F401 (autouse: every torch.empty is poisoned)
    randn,
    rel_err,
    row_invariant_dot,  # noqa: F401 (fixture, requested by name)
    use_tables,
)

GLU_CASES = [
    # m, inter (gate|up is [2 inter, k]), k, config
    (2, 64, 128, SkinnyConfig(16, 32, 64, 1, 4, 2)),
    (5, 40, 96, SkinnyConfig(16, 16, 64, 1, 4, 3)),  # ragged N against BLOCK_N, K against BLOCK_K
    (16, 72, 160, SkinnyConfig(16, 32, 64, 1, 4, 2)),  # a full M tile
    (33, 48, 64, SkinnyConfig(32, 16, 32, 1, 4, 2)),  # two M tiles, the second of one row
]


def glu_ref(x: torch.Tensor, gate_up: torch.Tensor) -> torch.Tensor:
    """The unfused pair's rounding: gate|up in the input dtype, then silu_and_mul's."""
    return activation.silu_and_mul_ref(linear.linear_ref(x.float(), gate_up.float()).to(x.dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,inter,k,cfg", GLU_CASES)
def test_swiglu_epilogue_matches_reference(dtype, m, inter, k, cfg):
    torch.manual_seed(19)
    x, gate_up = randn(m, k, dtype=dtype), randn(2 * inter, k, dtype=dtype, scale=0.2)
    out = mlp.swiglu_linear_with_config(x, gate_up, cfg)
    assert out.shape == (m, inter) and out.dtype == dtype
    assert rel_err(out, glu_ref(x, gate_up)) < TOL[dtype]
    pair = activation.silu_and_mul(linear.linear_with_config(x, gate_up, cfg))
    assert rel_err(out, pair) < TOL[dtype]


def test_swiglu_epilogue_refuses_what_it_cannot_serve():
    x, gate_up = randn(4, 64), randn(96, 64)
    for cfg in (SkinnyConfig(1, 16, 64, 1, 4, 2), SkinnyConfig(16, 16, 64, 2, 4, 2)):  # GEMV; split-K
        with pytest.raises(AssertionError):
            mlp.swiglu_linear_with_config(x, gate_up, cfg)


GATE_UP, DOWN = (192, 64), (64, 96)  # [2I, H] and [H, I] at I = 96, H = 64


def tables(gate_up: dict, down: dict | None = None, fused_m_max: int = 1, norm_m_max: int = 1) -> TunedTables:
    return TunedTables(
        device="test",
        linear={GATE_UP: gate_up, DOWN: down or {}},
        fused_m_max=fused_m_max,
        norm_m_max=norm_m_max,
    )


def test_glu_config_halves_gate_up_tile_where_no_prologue_serves():
    dot = SkinnyConfig(16, 64, 64, 1, 4, 5)
    t = tables({1: SkinnyConfig(1, 16, 64, 1, 4, 1), 8: dot, 16: SkinnyConfig(16, 32, 64, 1, 4, 4), 64: dot})
    assert mlp.glu_config(8, GATE_UP, DOWN, t) == SkinnyConfig(16, 32, 64, 1, 4, 5)
    assert mlp.glu_config(5, GATE_UP, DOWN, t) == SkinnyConfig(16, 32, 64, 1, 4, 5)  # bucket 8
    assert mlp.glu_config(16, GATE_UP, DOWN, t) == SkinnyConfig(16, 16, 64, 1, 4, 4)
    assert mlp.glu_config(1, GATE_UP, DOWN, t) is None  # one row: both prologues
    assert mlp.GLU_MAX_ROWS == 64 and mlp.glu_config(64, GATE_UP, DOWN, t) == SkinnyConfig(16, 32, 64, 1, 4, 5)
    t = tables({128: dot})
    assert mlp.glu_config(65, GATE_UP, DOWN, t) is None  # past GLU_MAX_ROWS
    assert mlp.glu_config(4, GATE_UP, DOWN, t) is None  # no gate|up entry at 4: cuBLAS


def test_glu_config_leaves_split_k_and_prologue_rows_alone(monkeypatch):
    split = tables({8: SkinnyConfig(16, 64, 64, 2, 4, 3)})
    assert mlp.glu_config(8, GATE_UP, DOWN, split) is None
    dot = {4: SkinnyConfig(16, 64, 64, 1, 4, 3), 8: SkinnyConfig(16, 64, 64, 1, 4, 3)}
    down = {4: SkinnyConfig(16, 32, 64, 2, 4, 3), 8: SkinnyConfig(16, 32, 64, 2, 4, 3)}
    fused = tables(dot, down, fused_m_max=4)  # SwiGLU in down's prologue up to 4 rows
    assert mlp.glu_config(4, GATE_UP, DOWN, fused) is None
    assert mlp.glu_config(8, GATE_UP, DOWN, fused) is not None
    normed = tables(dot, down, norm_m_max=8)  # the norm in gate|up's prologue up to 8 rows
    assert mlp.glu_config(8, GATE_UP, DOWN, normed) is None
    assert mlp.glu_config(8, (190, 64), DOWN, tables(dot)) is None  # gate|up not twice down's width
    monkeypatch.setattr(mlp, "GLU_MAX_ROWS", 0)
    assert mlp.glu_config(8, GATE_UP, DOWN, fused) is None


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 3, 8])
def test_mlp_matches_torch_backend(monkeypatch, dtype, m):
    """Each row count through its own kernels (one row: both prologues; 3: SwiGLU in down's prologue;
    8: the epilogue, as the tables say) against the torch backend's unfused ops."""
    dot = SkinnyConfig(16, 64, 64, 1, 4, 2)
    down = SkinnyConfig(16, 32, 32, 2, 4, 2)
    t = tables(
        {1: SkinnyConfig(1, 16, 64, 1, 4, 1), 4: dot, 8: dot},
        {1: SkinnyConfig(1, 16, 32, 2, 4, 1), 4: down, 8: down},
        fused_m_max=4,
    )
    use_tables(monkeypatch, t)
    assert (mlp.glu_config(m, GATE_UP, DOWN, t) is not None) == (m == 8)
    torch.manual_seed(20)
    x, residual = randn(m, 64, dtype=dtype), randn(m, 64, dtype=dtype)
    nw = randn(64, dtype=dtype).abs().add(0.5)
    gate_up, w_down = randn(*GATE_UP, dtype=dtype, scale=0.2), randn(*DOWN, dtype=dtype, scale=0.2)
    out, summed = get_ops("triton").mlp_to_residual(x, residual, nw, 1e-6, gate_up, w_down)
    ref, ref_summed = get_ops("torch").mlp_to_residual(x, residual, nw, 1e-6, gate_up, w_down)
    assert torch.equal(summed, ref_summed)
    assert rel_err(dense(out), ref) < 2 * TOL[dtype]


@pytest.mark.usefixtures("row_invariant_dot")
def test_batch_invariant_mlp_rows_do_not_depend_on_the_batch():
    """Batch-invariant mode keeps the unfused ops at every row count: a row's MLP output is the same
    bits alone and among eight."""
    ops = get_ops("triton", batch_invariant=True)
    torch.manual_seed(23)
    x, residual, nw = randn(8, 64), randn(8, 64), randn(64).abs().add(0.5)
    gate_up, w_down = randn(*GATE_UP, scale=0.2), randn(*DOWN, scale=0.2)
    out, summed = ops.mlp_to_residual(x, residual, nw, 1e-6, gate_up, w_down)
    one, one_summed = ops.mlp_to_residual(x[3:4], residual[3:4], nw, 1e-6, gate_up, w_down)
    assert torch.equal(out[3:4], one) and torch.equal(summed[3:4], one_summed)


@gpu
@pytest.mark.parametrize("m", [8, 16, 64])
def test_swiglu_epilogue_bit_identical_to_pair_on_4b_shapes(m):
    """bf16 at the Qwen3-4B gate|up: the epilogue at half the tile against gate|up at the full tile
    then silu_and_mul (the same K order per element), eagerly and replayed from a CUDA graph."""
    h, inter = QWEN3_4B["hidden"], QWEN3_4B["inter"]
    torch.manual_seed(21)
    x, gate_up = randn(m, h, dtype=torch.bfloat16), randn(2 * inter, h, dtype=torch.bfloat16, scale=0.02)
    full = SkinnyConfig(16 if m <= 16 else 64, 64, 64, 1, 4, 4)
    half = full._replace(block_n=32)
    pair = activation.silu_and_mul(linear.linear_with_config(x, gate_up, full))
    assert torch.equal(mlp.swiglu_linear_with_config(x, gate_up, half), pair)
    graph, out = capture_graph(lambda: mlp.swiglu_linear_with_config(x, gate_up, half))
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, pair)


@gpu
def test_mlp_on_4b_shapes_matches_reference():
    """The shipped dispatch at 2-64 rows (the epilogue up to mlp.GLU_MAX_ROWS, the pair above) on the
    4B MLP, bf16, against the fp32 reference."""
    h, inter = QWEN3_4B["hidden"], QWEN3_4B["inter"]
    torch.manual_seed(22)
    gate_up = randn(2 * inter, h, dtype=torch.bfloat16, scale=0.02)
    w_down = randn(h, inter, dtype=torch.bfloat16, scale=0.02)
    nw = randn(h, dtype=torch.bfloat16).abs().add(0.5)
    for m in (2, 8, 16, 32, 64):
        x, residual = randn(m, h, dtype=torch.bfloat16), randn(m, h, dtype=torch.bfloat16)
        out, _ = get_ops("triton").mlp_to_residual(x, residual, nw, 1e-6, gate_up, w_down)
        normed, _ = norm.add_rms_norm_ref(x.float(), residual.float(), nw.float(), 1e-6)
        ref = linear.linear_ref(activation.silu_and_mul_ref(normed @ gate_up.float().t()), w_down.float())
        assert rel_err(dense(out), ref) < TOL[torch.bfloat16], m
