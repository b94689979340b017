"""The tl.dot linear compiled for sm90 without a GPU (in a child process, where TRITON_INTERPRET is
off): under PDL it waits for the previous kernel first, then lets the next one launch, except with the
SwiGLU epilogue (GLU), whose next kernel (the down projection) launches at its exit; the epilogue's two
weight halves both stream through the pipeline."""

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
from engine.kernels import _triton, gemm

names = ["x_ptr", "w_ptr", "y_ptr", "p_ptr", "M", "N", "K", "stride_xm", "stride_wn", "stride_ym", "k_per_split",
         "up_off", "r_ptr", "nw_ptr", "s_ptr", "stride_rm", "stride_sm", "eps"]
types = ["*bf16", "*bf16", "*bf16", "*fp32"] + ["i32"] * 8 + ["*bf16"] * 3 + ["i32", "i32", "fp32"]
out = []
for bm, bn, bk, warps, stages, glu in json.loads(sys.argv[1]):
    const = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT=False, EVEN_K=True, PRECISION="tf32", SWIGLU=False,
                 NORM=False, PREFETCH=False, PDL=True, GLU=glu)
    sig = {**dict(zip(names, types)), **{c: "constexpr" for c in const}}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n not in ("M", "eps")}
    kernel = _triton.bind(gemm.__dict__)["_linear_kernel"]
    src = ASTSource(fn=kernel, signature=sig, constexprs=const, attrs=attrs)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages))
    lines = ptx.asm["ptx"].splitlines()
    wait = next(i for i, line in enumerate(lines) if "griddepcontrol.wait" in line)
    launch = [i for i, line in enumerate(lines) if "griddepcontrol.launch_dependents" in line]
    copies = sum("cp.async" in line and "commit" not in line and "wait" not in line for line in lines)
    out.append([wait, launch, copies])
print(json.dumps(out))
"""
CONFIGS = [  # BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, GLU
    (16, 64, 64, 4, 5, False),
    (16, 32, 64, 4, 5, True),  # the epilogue at half the tile: the same weight bytes a K step
]


def test_the_next_kernel_launches_early_except_after_the_swiglu_epilogue():
    (wait, launch, plain), (_, glu_launch, glu) = compile_in_child(CHILD, json.dumps(CONFIGS))
    assert len(launch) == 1 and launch[0] > wait  # after the wait, as every PDL kernel here
    assert glu_launch == []
    assert glu == plain > 0  # gate's and up's half tiles take the plain tile's asynchronous copies
