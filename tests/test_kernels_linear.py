"""The skinny-M linear kernel, its dispatch (tuned table vs cuBLAS) and the batch-invariant GEMM
against their torch references (setup and tolerance policy: tests/kernel_helpers.py)."""

from __future__ import annotations

import pytest
import torch

from engine.kernels import linear, tuning
from engine.kernels.tuning import SkinnyConfig, TunedTables
from tests.kernel_helpers import (
    DTYPES,
    TOL,
    gpu,
    poison_empty,  # noqa: F401 (autouse: every torch.empty is poisoned)
    randn,
    rel_err,
    row_invariant_dot,  # noqa: F401 (fixture, requested by name)
    use_tables,
)

LINEAR_CASES = [
    (1, 96, 256, linear.SkinnyConfig(1, 32, 64, 1, 4, 2)),  # GEMV
    (1, 40, 1000, linear.SkinnyConfig(1, 32, 128, 4, 4, 2)),  # GEMV, ragged K, split-K
    (3, 64, 200, linear.SkinnyConfig(16, 32, 64, 2, 4, 2)),  # dot path, split-K, ragged K
    (17, 130, 96, linear.SkinnyConfig(32, 64, 32, 1, 4, 2)),  # ragged N, one M tile
    (40, 64, 128, linear.SkinnyConfig(16, 32, 32, 4, 4, 2)),  # several M tiles + split-K
    (5, 48, 160, None),  # the default heuristic
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k,cfg", LINEAR_CASES)
def test_linear_skinny(dtype, m, n, k, cfg):
    torch.manual_seed(7)
    x, w = randn(m, k, dtype=dtype), randn(n, k, dtype=dtype, scale=0.1)
    cfg = cfg or linear.default_skinny_config(m, n, k)
    out = linear.linear_with_config(x, w, cfg)
    assert out.shape == (m, n) and out.dtype == dtype
    assert rel_err(out, linear.linear_ref(x.float(), w.float())) < TOL[dtype]


def test_linear_dispatch(monkeypatch):
    torch.manual_seed(8)
    use_tables(monkeypatch, tuning.DEFAULT)
    w = randn(64, 96)
    for shape in [(0, 96), (1, 96), (2, 3, 96), (9, 96)]:
        x = randn(*shape)
        out = linear.linear(x, w)
        assert out.shape == (*shape[:-1], 64)
        if x.numel():
            assert rel_err(out, linear.linear_ref(x, w)) < TOL[torch.float32]
    use_tables(monkeypatch, TunedTables("test", m_max=4))  # above the crossover: F.linear
    x = randn(9, 96)
    assert torch.equal(linear.linear(x, w), linear.linear_ref(x, w))
    assert linear.skinny_config(5, 64, 96, TunedTables("test", m_max=4)) is None
    assert linear.skinny_config(16, 64, 96) == linear.default_skinny_config(16, 64, 96)  # DEFAULT: m_max 16
    assert linear.skinny_config(17, 64, 96) is None
    # A tuned shape uses its table entry per M bucket; a missing bucket means cuBLAS.
    gemv, dot = SkinnyConfig(1, 16, 32, 1, 2, 1), SkinnyConfig(16, 16, 32, 2, 4, 1)
    t = TunedTables("test", linear={(64, 96): {1: gemv, 2: dot}})
    assert linear.skinny_config(1, 64, 96, t) == SkinnyConfig(1, 16, 32, 1, 2, 1)
    assert linear.skinny_config(2, 64, 96, t).split_k == 2
    assert linear.skinny_config(3, 64, 96, t) is None
    assert linear.skinny_config(2, 64, 128, t) == linear.default_skinny_config(2, 64, 128)  # untuned shape
    use_tables(monkeypatch, t)
    x = randn(2, 96)
    assert rel_err(linear.linear(x, w), linear.linear_ref(x, w)) < TOL[torch.float32]
    x = randn(3, 96)  # bucket 4 is missing: F.linear, bit for bit
    assert torch.equal(linear.linear(x, w), linear.linear_ref(x, w))


@pytest.mark.usefixtures("row_invariant_dot")
@pytest.mark.parametrize(
    "fn",
    [linear.linear, linear.linear_ref, linear.linear_batch_invariant, linear.linear_batch_invariant_ref],
    ids=["linear", "ref", "invariant", "invariant-ref"],
)
@pytest.mark.parametrize("m", [1, 3, 9])  # GEMV, dot path, above the table's m_max: cuBLAS
def test_linear_writes_into_out(monkeypatch, fn, m):
    """out= (the runner's shared logits buffer): the same bits as a fresh result, in that buffer."""
    torch.manual_seed(10)
    use_tables(monkeypatch, TunedTables("test", m_max=4))
    x, w = randn(m, 96), randn(72, 96, scale=0.1)
    buf = torch.full((12, 72), float("nan"), device=x.device)
    got = fn(x, w, out=buf[:m])
    assert got.data_ptr() == buf.data_ptr() and torch.equal(got, fn(x, w))
    assert buf[m:].isnan().all()


@pytest.mark.usefixtures("row_invariant_dot")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_linear_batch_invariant(dtype):
    torch.manual_seed(9)
    n, k = 80, 200  # ragged against the fixed 64-wide N and K tiles
    x, w = randn(64, k, dtype=dtype), randn(n, k, dtype=dtype, scale=0.1)
    full = linear.linear_batch_invariant(x, w)
    assert rel_err(full, linear.linear_batch_invariant_ref(x.float(), w.float())) < TOL[dtype]
    for rows in (1, 7, 33):
        assert torch.equal(linear.linear_batch_invariant(x[:rows], w), full[:rows]), rows
    assert torch.equal(linear.linear_batch_invariant(x[5:6], w), full[5:6])
    assert linear.linear_batch_invariant(x[:0], w).shape == (0, n)


# --- GPU only -----------------------------------------------------------------------------------


@gpu
@pytest.mark.parametrize("n,k", [(6144, 2560), (2560, 9728), (151936, 2560)])
def test_gpu_linear_batch_invariant_bitexact(n, k):
    torch.manual_seed(16)
    x, w = randn(64, k, dtype=torch.bfloat16), randn(n, k, dtype=torch.bfloat16, scale=0.05)
    full = linear.linear_batch_invariant(x, w)
    for rows in (1, 7, 16, 33):
        assert torch.equal(linear.linear_batch_invariant(x[:rows], w), full[:rows]), rows
    assert torch.equal(linear.linear_batch_invariant(x[9:10], w), full[9:10])
