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
