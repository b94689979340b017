"""The early-weights GEMV compiled for sm90 without a GPU (triton.compile to PTX in a child process,
where TRITON_INTERPRET is off): the first weight tile's loads come before `griddepcontrol.wait`, and
nothing else is loaded before it (the activation is read only after the wait)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("triton", reason="triton is not installed: nothing to compile")

from tests.kernel_helpers import compile_in_child  # noqa: E402

CHILD = r"""
import json, sys
from tests.ptx_helpers import compile_gemv_ptx
from engine.kernels.tuning import SkinnyConfig

out = []
for bn, bk, warps, swiglu, norm, carry, planes, split in json.loads(sys.argv[1]):
    cfg = SkinnyConfig(1, bn, bk, 2 if split else 1, warps, 2 if carry else 1)
    lines = compile_gemv_ptx(cfg, 4 * bk, swiglu, norm, planes).splitlines()  # K: whole tiles (EVEN_K unsplit)
    wait = next(i for i, line in enumerate(lines) if "griddepcontrol.wait" in line)
    out.append([[line.strip() for line in lines[:wait] if "ld.global" in line],
                sum("ld.global" in line for line in lines[wait:])])
print(json.dumps(out))
"""


CONFIGS = [  # BLOCK_N, BLOCK_K, warps, SWIGLU, NORM, CARRY, PLANES, SPLIT
    (8, 512, 4, False, False, True, 0, False),
    (8, 512, 4, True, False, True, 0, False),
    (16, 512, 4, False, True, False, 0, False),  # add + RMSNorm -> q|k|v
    (16, 512, 4, False, True, False, 2, False),  # the same, summing down's two split-K planes (split_sum.SplitSum)
    (16, 256, 4, False, False, True, 0, True),  # the H200 table's one-row o, split 4, deferred (masked K)
    (8, 512, 4, True, False, False, 0, True),  # its SwiGLU -> down, split 2, deferred
]


def test_weight_tile_loads_before_the_pdl_wait():
    results = compile_in_child(CHILD, json.dumps(CONFIGS))
    for (bn, bk, warps, *_), (before, after) in zip(CONFIGS, results, strict=True):
        # one 16-byte vector load per 8 bf16 weights of the tile, spread over the threads
        assert len(before) == bn * bk * 2 // 16 // (32 * warps), before
        assert all(".v4." in line for line in before), before
        assert after > 0  # the activation (and the loop's tiles) after the wait
