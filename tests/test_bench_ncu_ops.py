"""engine.bench.ncu_ops: the ops it offers Nsight Compute, and its refusal without a GPU."""

from __future__ import annotations

import pytest
import torch

from engine.bench import ncu_ops


def test_ops_are_the_decode_layer():
    assert set(ncu_ops.OPS) == {"qkv", "attention", "o", "gate_up", "down"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for hosts without a GPU")
def test_refuses_without_a_gpu(capsys):
    with pytest.raises(SystemExit) as exit_info:
        ncu_ops.main(["--op", "attention", "--rows", "64"])
    assert exit_info.value.code == 2 and "needs a CUDA device" in capsys.readouterr().err


@pytest.mark.parametrize("flags", [["--rows", "0"], ["--ctx", "0"], ["--warmup", "-1"], ["--op", "lm_head"]])
def test_bad_values_are_refused_before_any_gpu_work(flags, capsys):
    with pytest.raises(SystemExit) as exit_info:
        ncu_ops.main(["--op", "o", *flags])
    assert exit_info.value.code == 2 and "error" in capsys.readouterr().err
