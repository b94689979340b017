"""The span step's metadata kernel (engine/kernels/span_meta.py) against its torch reference: exact,
on the block-table rows the runner stages (the null row among them), at decode, verify and drafter
spans, and replayed from a CUDA graph on the GPU."""

from __future__ import annotations

import pytest
import torch

from engine.kernels.span_meta import span_meta, span_meta_ref
from tests.kernel_helpers import DEV, gpu, poison_empty  # noqa: F401


def _case(n: int, page: int, max_blocks: int, seed: int):
    """A table of n request rows, a null row and a spare; each request at a random committed length."""
    g = torch.Generator().manual_seed(seed)
    tables = torch.randint(1, 1000, (n + 2, max_blocks), generator=g, dtype=torch.int32)
    tables[n] = 0  # the null row padded rows point at
    rows = torch.randperm(n, generator=g)
    rows[-1] = n  # a padded row
    return tables.to(DEV), rows.to(DEV), g


@pytest.mark.parametrize(
    ("n", "span", "page", "max_blocks"), [(1, 1, 16, 8), (5, 1, 4, 37), (3, 4, 4, 9), (4, 16, 16, 3)]
)
def test_span_meta_is_the_reference_exactly(n, span, page, max_blocks):
    tables, rows, g = _case(n, page, max_blocks, seed=n * 100 + span)
    num_kv = torch.randint(0, max_blocks * page - span + 1, (n,), generator=g).to(DEV)
    got, ref = span_meta(tables, rows, num_kv, span, page), span_meta_ref(tables, rows, num_kv, span, page)
    for name, a, b in zip(("positions", "slots", "tables", "seq_lens", "query_start_loc"), got, ref, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), name


def test_no_request_gives_empty_rows_and_one_start():
    tables, _, _ = _case(2, 4, 5, seed=1)
    rows = num_kv = torch.zeros(0, dtype=torch.int64, device=DEV)
    positions, slots, got_tables, seq_lens, qsl = span_meta(tables, rows, num_kv, 1, 4)
    assert positions.numel() == slots.numel() == got_tables.numel() == seq_lens.numel() == 0
    assert qsl.tolist() == [0]


@gpu
def test_gpu_graph_replay_follows_the_staged_inputs():
    n, span, page = 8, 4, 16
    tables, rows, g = _case(n, page, 64, seed=7)
    num_kv = torch.randint(0, 64 * page - span, (n,), generator=g).to(DEV)
    span_meta(tables, rows, num_kv, span, page)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = span_meta(tables, rows, num_kv, span, page)
    for step in range(3):
        num_kv.add_(span)
        rows.copy_(rows.roll(1))
        tables[0, step] = 999
        graph.replay()
        for a, b in zip(out, span_meta_ref(tables, rows, num_kv, span, page), strict=True):
            assert torch.equal(a, b)
