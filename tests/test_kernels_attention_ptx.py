"""Decode attention compiled for sm90 without a GPU (in a child process, where TRITON_INTERPRET is
off): with the early prefetch, each program's first key tile is pulled into L2 before
`griddepcontrol.wait`, and nothing but the bounds (query_start_loc, seq_lens, the block table) is
loaded before it; without it, nothing is prefetched. The bounds are not read again after the wait;
the splits' reduce reads its row count before its wait too."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("triton", reason="triton is not installed: nothing to compile")

from tests.kernel_helpers import compile_in_child  # noqa: E402

CHILD = r"""
import json, sys
from tests.ptx_helpers import compile_attention_ptx
out = []
for block_n, warps, splits, early in json.loads(sys.argv[1]):
    lines = compile_attention_ptx(block_n, warps, 2, splits, early).splitlines()
    wait = next(i for i, line in enumerate(lines) if "griddepcontrol.wait" in line)
    before, after = lines[:wait], lines[wait:]
    out.append([sum("prefetch.global.L2" in l for l in before), sum("prefetch.global.L2" in l for l in after),
                [l.strip() for l in before if "ld.global" in l], sum("ld.global.b32" in l for l in after)])
print(json.dumps(out))
"""
CONFIGS = [  # BLOCK_N, warps, splits, lines a row
    (64, 4, 1, 2),
    (32, 4, 8, 2),
    (64, 4, 1, 0),
]


def test_the_first_key_tile_and_the_bounds_are_read_before_the_pdl_wait():
    results = compile_in_child(CHILD, json.dumps(CONFIGS))
    for (block_n, warps, _, early), (before, after, loads, _) in zip(CONFIGS, results, strict=True):
        # K and V: `early` lines a row of BLOCK_N rows, spread over the program's threads
        assert before == (2 * max(1, early * block_n // (32 * warps)) if early else 0) and after == 0
        # the bounds only, 32-bit words (no K, V or q tile is read before the wait)
        assert loads and all("ld.global.b32" in line for line in loads), loads
    # the prefetch adds no 32-bit load after the wait: the bounds are read once, before it
    assert results[0][3] == results[2][3]


REDUCE_CHILD = r"""
import json
from engine.kernels import attention_kernels
from tests.ptx_helpers import compile_kernel, loads_around_wait

types = {"part_o_ptr": "*fp32", "part_lse_ptr": "*fp32", "qsl_ptr": "*i32"}
const = dict(HQ=32, D=128, NUM_SPLITS=16, PDL=True)
ptx = compile_kernel(attention_kernels, "paged_attn_reduce_kernel", types, const, num_warps=4)
print(json.dumps(loads_around_wait(ptx)))
"""


def test_the_reduce_reads_its_row_count_before_the_pdl_wait():
    before, after = compile_in_child(REDUCE_CHILD)
    assert before == 1 and after > 0  # the row count; the splits' partials after the wait
