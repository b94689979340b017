"""The kernel before/after bench: its switch back to the previous dispatch and its argument checks
(the timing itself needs a GPU)."""

from __future__ import annotations

import pytest
import torch

from engine.bench import kernel_ab
from engine.kernels import _triton, attention, fused_linear
from tests.kernel_helpers import CUDA, randn


def test_before_restores_the_current_dispatch():
    saved = attention.DECODE_WIDE_BLOCK_N, fused_linear.add_rms_norm_linear_config, _triton.PDL
    with kernel_ab.before():
        assert not _triton.PDL
        assert fused_linear.add_rms_norm_linear_config(1, 64, 64) is None
        assert attention.attention_config(64, 8, 4, 1, 512, torch.device("cpu"), False)[2] == attention.DECODE_BLOCK_N
    assert (attention.DECODE_WIDE_BLOCK_N, fused_linear.add_rms_norm_linear_config, _triton.PDL) == saved
    assert attention.attention_config(64, 8, 4, 1, 512, torch.device("cpu"), False)[2] == attention.DECODE_WIDE_BLOCK_N


def test_before_is_the_same_function():
    """Both sides of a pair compute the op to the dtype's tolerance (here: the interpreter, fp32)."""
    x, r, nw, w = randn(2, 64), randn(2, 64), randn(64), randn(32, 64)
    after = fused_linear.add_rms_norm_linear(x, r, nw, 1e-6, w)
    with kernel_ab.before():
        prev = fused_linear.add_rms_norm_linear(x, r, nw, 1e-6, w)
    assert torch.equal(after[1], prev[1]) and torch.allclose(after[0], prev[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("argv", [["--ms", "0"], ["--ms", "1", "-3"]])
def test_refuses_bad_row_counts(tmp_path, argv):
    with pytest.raises(SystemExit, match="--ms"):
        kernel_ab.main(["--out", str(tmp_path), *argv])


@pytest.mark.skipif(CUDA, reason="checks the message on a host without a GPU")
def test_needs_a_gpu(tmp_path):
    with pytest.raises(SystemExit, match="CUDA"):
        kernel_ab.main(["--out", str(tmp_path)])
