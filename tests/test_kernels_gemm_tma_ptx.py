"""The TMA GEMM compiled for sm90 without a GPU (in a child process, where TRITON_INTERPRET is off): its
tiles come in by TMA (cp.async.bulk.tensor), after the PDL wait, and feed the warpgroup MMA; the
next kernel launches early except after the SwiGLU epilogue, as with gemm._linear_kernel."""

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
from engine.kernels import _triton, gemm_tma

out = []
for bm, bn, bk, warps, stages, glu, split in json.loads(sys.argv[1]):
    names = ["x_desc", "w_desc", "y_ptr", "M", "N", "K", "stride_ym", "k_per_split"]
    types = [f"tensordesc<bf16[{bm}, {bk}]>", f"tensordesc<bf16[{bn}, {bk}]>", "*fp32" if split else "*bf16"]
    types += ["i32"] * 5
    const = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT=split, PRECISION="tf32", PDL=True, GLU=glu)
    sig = {**dict(zip(names, types)), **{c: "constexpr" for c in const}}
    attrs = {(2,): [["tt.divisibility", 16]]}
    kernel = _triton.bind(gemm_tma.__dict__)["_linear_tma_kernel"]
    src = ASTSource(fn=kernel, signature=sig, constexprs=const, attrs=attrs)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages))
    lines = ptx.asm["ptx"].splitlines()
    tma = sum("cp.async.bulk.tensor" in line for line in lines)
    wgmma = sum("wgmma.mma_async" in line for line in lines)
    wait = next(i for i, line in enumerate(lines) if "griddepcontrol.wait" in line)
    first_tma = next(i for i, line in enumerate(lines) if "cp.async.bulk.tensor" in line)
    launches = sum("griddepcontrol.launch_dependents" in line for line in lines)
    out.append([tma, wgmma, wait < first_tma, launches])
print(json.dumps(out))
"""
CONFIGS = [  # BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, GLU, SPLIT
    (64, 64, 64, 4, 4, False, False),
    (64, 64, 64, 4, 4, True, False),
    (16, 64, 128, 4, 3, False, True),
]


def test_tiles_come_by_tma_after_the_wait_into_the_warpgroup_mma():
    (plain, glu, split) = compile_in_child(CHILD, json.dumps(CONFIGS))
    for copies, wgmma, wait_first, _ in (plain, glu, split):
        assert copies >= 2 and wgmma > 0 and wait_first
    assert glu[0] > plain[0]  # the up half's tiles too
    assert plain[3] == split[3] == 1 and glu[3] == 0  # the down projection launches at the epilogue's exit
