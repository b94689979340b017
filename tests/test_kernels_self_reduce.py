"""The self-reducing split-K (split_sum.SELF_REDUCE): a tl.dot or TMA projection that splits K sums
its own partials, the program with a tile's last ticket adding the tile's planes in split order. It
must give the reduce kernel's result bit for bit, launch no reduce kernel, leave its ticket counters
at zero for the next launch (a CUDA graph replays them as they are), and fall back to the reduce
kernel where it cannot have counters (setup and tolerance policy: tests/kernel_helpers.py)."""

from __future__ import annotations

import pytest
import torch

from engine.kernels import gemm, linear, split_sum
from engine.kernels.tuning import SkinnyConfig
from tests.kernel_helpers import (
    DTYPES,
    QWEN3_4B,
    TOL,
    capture_graph,
    gpu,
    poison_empty,  # noqa: F401 (autouse: every torch.empty is poisoned)
    randn,
    rel_err,
)

CASES = [
    # m, n, k, config
    (5, 70, 256, SkinnyConfig(16, 32, 64, 2, 4, 2)),  # tl.dot, ragged N
    (33, 64, 300, SkinnyConfig(16, 32, 64, 3, 4, 2)),  # tl.dot, three M tiles, a ragged last split
    (8, 48, 192, SkinnyConfig(16, 16, 64, 4, 4, 2)),  # tl.dot, split 4 over 3 K tiles: an empty split
    (20, 96, 256, SkinnyConfig(16, 64, 64, 4, 4, 2, tma=1)),  # TMA, ragged N
    (33, 64, 256, SkinnyConfig(32, 64, 32, 4, 4, 2, tma=1)),  # TMA, two M tiles
]


@pytest.fixture
def reduces(monkeypatch):
    """The reduce kernel's launches while the test runs."""
    launched = []
    real = split_sum.reduce_parts
    monkeypatch.setattr(split_sum, "reduce_parts", lambda p, y: (launched.append(p.shape), real(p, y))[1])
    monkeypatch.setattr(gemm, "reduce_parts", split_sum.reduce_parts)
    return launched


def counters_zero(device: str) -> bool:
    return all(int(c.abs().sum()) == 0 for d, c in split_sum._counters.items() if d.type == device)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k,cfg", CASES, ids=str)
def test_the_last_split_sums_the_tile_as_the_reduce_kernel_does(reduces, monkeypatch, dtype, m, n, k, cfg):
    torch.manual_seed(71)
    x, w = randn(m, k, dtype=dtype), randn(n, k, dtype=dtype, scale=0.2)
    own = linear.linear_with_config(x, w, cfg)
    assert reduces == [] and counters_zero(x.device.type)
    assert rel_err(own, linear.linear_ref(x.float(), w.float())) < TOL[dtype]
    monkeypatch.setattr(split_sum, "SELF_REDUCE", False)
    kernel = linear.linear_with_config(x, w, cfg)
    assert reduces == [(cfg.split_k, m, n)] and torch.equal(own, kernel)


def test_a_grid_past_the_counters_uses_the_reduce_kernel(reduces, monkeypatch):
    m, n, k, cfg = CASES[0]
    x, w = randn(m, k), randn(n, k)
    own = linear.linear_with_config(x, w, cfg)
    monkeypatch.setattr(split_sum, "COUNTER_SLOTS", 2)  # three N tiles
    assert torch.equal(linear.linear_with_config(x, w, cfg), own) and reduces == [(2, m, n)]


def test_whole_k_and_one_row_splits_take_no_counters(monkeypatch):
    taken = []
    real = split_sum.tile_counters
    monkeypatch.setattr(gemm, "tile_counters", lambda d, t: taken.append(t) or real(d, t))
    x, w = randn(8, 128), randn(64, 128)
    linear.linear_with_config(x, w, SkinnyConfig(16, 32, 64, 1, 4, 2))  # no split
    linear.linear_with_config(x[:1], w, SkinnyConfig(1, 16, 64, 2, 4, 1))  # the GEMV
    assert taken == []
    linear.linear_with_config(x, w, SkinnyConfig(16, 32, 64, 2, 4, 2))
    assert taken == [2]


@gpu
def test_gpu_no_counters_are_made_inside_a_capture(monkeypatch):
    monkeypatch.setattr(split_sum, "_counters", {})
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        inside = split_sum.tile_counters(torch.device("cuda", torch.cuda.current_device()), 8)
    assert inside is None and split_sum._counters == {}


@gpu
@pytest.mark.parametrize("m", [8, 16, 32, 64])
@pytest.mark.parametrize("which", ["o", "down"])
def test_gpu_4b_o_and_down_as_dispatched_eager_and_replayed(reduces, monkeypatch, m, which):
    """bf16 at the 4B o and down shapes through the device's dispatch (TMA split 4 on the H200), twenty
    launches in one graph under PDL, replayed five times: every result is the reduce kernel's, and the
    counters are back at zero after each replay."""
    torch.manual_seed(73)
    h, k = QWEN3_4B["hidden"], QWEN3_4B["hq"] * QWEN3_4B["d"] if which == "o" else QWEN3_4B["inter"]
    xs = [randn(m, k, dtype=torch.bfloat16) for _ in range(20)]
    w = randn(h, k, dtype=torch.bfloat16, scale=0.05)
    monkeypatch.setattr(split_sum, "SELF_REDUCE", False)
    kernel = [linear.linear(x, w) for x in xs]
    split = bool(reduces)
    monkeypatch.setattr(split_sum, "SELF_REDUCE", True)
    reduces.clear()
    assert all(torch.equal(linear.linear(x, w), y) for x, y in zip(xs, kernel, strict=True))
    graph, replayed = capture_graph(lambda: [linear.linear(x, w) for x in xs])
    assert reduces == [] and (not split or split_sum._counters)
    for _ in range(5):
        graph.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(a, b) for a, b in zip(replayed, kernel, strict=True)) and counters_zero("cuda")
