"""The kernel before/after bench: its switch back to the previous dispatch (every one-row GEMV waits
first), its cases and its argument checks (the timing itself needs a GPU)."""

from __future__ import annotations

import pytest
import torch

from engine.bench import kernel_ab
from engine.kernels import fused_linear, gemm, linear, tuning
from engine.kernels.tuning import SkinnyConfig
from tests.kernel_helpers import CUDA, randn

O_SHAPE, DOWN = (2560, 4096), (2560, 9728)


def test_before_makes_every_one_row_gemv_wait_first_and_restores_the_dispatch():
    assert sorted(gemm.EARLY_WEIGHTS) == ["norm"]  # measured faster on the H200 with the norm prologue only
    with kernel_ab.before():
        assert not gemm.EARLY_WEIGHTS
    assert sorted(gemm.EARLY_WEIGHTS) == ["norm"]


def test_the_h200_table_keeps_the_split_k_one_row_o_and_down():
    t = tuning.load("NVIDIA H200")
    assert t.linear[O_SHAPE][1] == SkinnyConfig(1, 16, 256, 4, 4, 2)
    assert t.silu_mul_linear[DOWN][1] == SkinnyConfig(1, 8, 512, 2, 4, 1)


def test_a_candidate_runs_on_the_early_weights_gemv_whatever_the_dispatch():
    seen = []
    kernel_ab.on_gemv(lambda: seen.append(gemm.EARLY_WEIGHTS))
    assert seen == [gemm.PROLOGUES] and sorted(gemm.EARLY_WEIGHTS) == ["norm"]


@pytest.mark.parametrize("swiglu", [False, True])
def test_before_is_the_same_function(swiglu):
    """Both sides of a pair compute the op to the dtype's tolerance (here: the interpreter, fp32)."""
    w = randn(32, 64)
    x = randn(1, 128 if swiglu else 64)
    op = fused_linear.silu_mul_linear if swiglu else linear.linear
    after = op(x, w)
    with kernel_ab.before():
        prev = op(x, w)
    assert torch.allclose(after, prev, rtol=1e-4, atol=1e-5)


def test_cases_cover_o_and_down_at_every_m_and_the_norm_pairs_at_one_row():
    rows = [(label, m) for label, m, _ in kernel_ab.cases_for([1, 8, 16, 64])]
    for m in (1, 8, 16, 64):
        assert ("o", m) in rows and ("SwiGLU→down", m) in rows
    assert ("norm→q|k|v", 1) in rows and ("norm→gate|up", 1) in rows
    assert not any(label.startswith("norm") and m > 1 for label, m in rows)
    assert sum(label.startswith("o [") for label, _ in rows) == len(kernel_ab.CANDIDATES)
    assert sum(label.startswith("norm→gate|up [") for label, _ in rows) == len(kernel_ab.NORM_CANDIDATES)
    for c in kernel_ab.CANDIDATES + kernel_ab.NORM_CANDIDATES:
        assert tuning.check_config(c) is None and c.block_m == 1, c
    assert all(c.split_k == 1 for c in kernel_ab.NORM_CANDIDATES)  # the prologue needs whole rows


@pytest.mark.parametrize("argv", [["--ms", "0"], ["--ms", "1", "-3"]])
def test_refuses_bad_row_counts(tmp_path, argv):
    with pytest.raises(SystemExit, match="--ms"):
        kernel_ab.main(["--out", str(tmp_path), *argv])


@pytest.mark.skipif(CUDA, reason="checks the message on a host without a GPU")
def test_needs_a_gpu(tmp_path):
    with pytest.raises(SystemExit, match="CUDA"):
        kernel_ab.main(["--out", str(tmp_path)])
