"""The tl.dot linear compiled for sm90 without a GPU (in a child process, where TRITON_INTERPRET is
off): with EARLY_LINES, each program's first weight lines are prefetched into L2 before
`griddepcontrol.wait` and nothing is loaded before it (the activation is the previous kernel's
output); without, nothing is prefetched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="triton is not installed: nothing to compile")

ROOT = Path(__file__).resolve().parents[1]
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
for bm, bn, bk, split, warps, stages, norm, early in json.loads(sys.argv[1]):
    const = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT=split, EVEN_K=True, PRECISION="tf32", SWIGLU=False,
                 NORM=norm, PREFETCH=norm, EARLY_LINES=early, LINE=64, PDL=True)
    sig = {**dict(zip(names, types)), **{c: "constexpr" for c in const}}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n not in ("M", "eps")}
    kernel = _triton.bind(gemm.__dict__)["_linear_kernel"]
    src = ASTSource(fn=kernel, signature=sig, constexprs=const, attrs=attrs)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages))
    lines = ptx.asm["ptx"].splitlines()
    wait = next(i for i, line in enumerate(lines) if "griddepcontrol.wait" in line)
    before = lines[:wait]
    out.append([sum("prefetch.global.L2" in l for l in before), sum("prefetch.global.L2" in l for l in lines[wait:]),
                sum("ld.global" in l or "cp.async" in l for l in before)])
print(json.dumps(out))
"""
CONFIGS = [  # BLOCK_M, BLOCK_N, BLOCK_K, SPLIT, warps, stages, NORM prologue, lines a weight row
    (16, 64, 64, False, 4, 5, False, 4),  # gate|up at 2-16 rows
    (64, 64, 64, True, 4, 4, False, 2),  # down at 64 rows, split 8
    (16, 64, 64, False, 4, 3, True, 2),  # add + RMSNorm prologue
    (16, 64, 64, False, 4, 5, False, 0),  # off
]


def test_the_first_weight_lines_are_prefetched_before_the_pdl_wait():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(CONFIGS)], capture_output=True, text=True, env=env, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    for (_, bn, _, _, warps, _, _, early), (before, after, loads) in zip(
        CONFIGS, json.loads(run.stdout.strip().splitlines()[-1]), strict=True
    ):
        assert before == max(1, early * bn // (32 * warps)) if early else before == 0
        assert after == 0 and loads == 0  # nothing read before the wait: x is the previous kernel's output
