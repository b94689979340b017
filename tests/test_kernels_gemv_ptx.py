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
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from engine.kernels import _triton, gemv

names = ["x_ptr", "w_ptr", "y_ptr", "p_ptr", "M", "N", "K", "stride_xm", "stride_wn", "stride_ym", "k_per_split",
         "x_off", "r_ptr", "nw_ptr", "s_ptr", "stride_rm", "stride_sm", "eps"]
out = []
for bn, bk, warps, swiglu, norm, carry, planes, split in json.loads(sys.argv[1]):
    x_type = "*fp32" if planes else "*bf16"  # a SplitSum's fp32 partials where PLANES > 0
    types = [x_type, "*bf16", "*bf16", "*fp32"] + ["i32"] * 8 + ["*bf16"] * 3 + ["i32", "i32", "fp32"]
    const = dict(BLOCK_N=bn, BLOCK_K=bk, SPLIT=split, EVEN_K=not split, SWIGLU=swiglu, NORM=norm, CARRY=carry,
                 PLANES=planes, PDL=True)
    sig = {**dict(zip(names, types)), **{c: "constexpr" for c in const}}
    # what the launcher specializes for 16-aligned pointers and sizes
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n not in ("M", "eps")}
    kernel = _triton.bind(gemv.__dict__)["_gemv_kernel"]
    src = ASTSource(fn=kernel, signature=sig, constexprs=const, attrs=attrs)
    target = GPUTarget("cuda", 90, 32)
    ptx = triton.compile(src, target=target, options=dict(num_warps=warps, num_stages=1)).asm["ptx"]
    lines = ptx.splitlines()
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
