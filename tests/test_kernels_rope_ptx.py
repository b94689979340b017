"""QK-norm + RoPE + KV store compiled for sm90 without a GPU (in a child process, where
TRITON_INTERPRET is off): the position, slot, cos/sin and norm-weight loads come before
`griddepcontrol.wait` and the q/k/v rows after it."""

from __future__ import annotations

import pytest

pytest.importorskip("triton", reason="triton is not installed: nothing to compile")

from tests.kernel_helpers import compile_in_child  # noqa: E402

CHILD = r"""
import json
from engine.kernels import rope
from tests.ptx_helpers import compile_kernel, loads_around_wait

types = {"pos_ptr": "*i64", "slot_ptr": "*i64", "cs_ptr": "*fp32", "eps": "fp32"}
const = dict(HQ=32, HKV=8, D=128, HB=8, HAS_Q=True, SPLITS=0, PDL=True)
ptx = compile_kernel(rope, "_qk_norm_rope_store_kernel", types, const, lambda n: n.endswith("_ptr"), num_warps=4)
print(json.dumps(loads_around_wait(ptx)))
"""


def test_the_step_inputs_are_read_before_the_pdl_wait():
    before, after = compile_in_child(CHILD)
    # position, slot, cos, sin and both norm weights with their partners before; q/k/v rows after
    assert before >= 6 and after > 0
