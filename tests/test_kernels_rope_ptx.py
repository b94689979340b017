"""QK-norm + RoPE + KV store compiled for sm90 without a GPU (in a child process, where
TRITON_INTERPRET is off): the position, slot, cos/sin and norm-weight loads come before
`griddepcontrol.wait` and the q/k/v rows after it."""

from __future__ import annotations

import pytest

pytest.importorskip("triton", reason="triton is not installed: nothing to compile")

from tests.kernel_helpers import compile_in_child  # noqa: E402

CHILD = r"""
import inspect, json
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from engine.kernels import _triton, rope

kernel = _triton.bind(rope.__dict__)["_qk_norm_rope_store_kernel"]
names = list(inspect.signature(kernel.fn).parameters)
types = {"pos_ptr": "*i64", "slot_ptr": "*i64", "cs_ptr": "*fp32", "eps": "fp32"}
const = dict(HQ=32, HKV=8, D=128, HB=8, HAS_Q=True, SPLITS=0, PDL=True)
sig = {n: "constexpr" if n in const else types.get(n, "*bf16" if n.endswith("_ptr") else "i32") for n in names}
attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n.endswith("_ptr")}
src = ASTSource(fn=kernel, signature=sig, constexprs=const, attrs=attrs)
lines = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4)).asm["ptx"].splitlines()
wait = next(i for i, line in enumerate(lines) if "griddepcontrol.wait" in line)
loads = [i for i, line in enumerate(lines) if "ld.global" in line]
print(json.dumps([sum(i < wait for i in loads), sum(i > wait for i in loads)]))
"""


def test_the_step_inputs_are_read_before_the_pdl_wait():
    before, after = compile_in_child(CHILD)
    # position, slot, cos, sin and both norm weights with their partners before; q/k/v rows after
    assert before >= 6 and after > 0
