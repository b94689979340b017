"""The handoff micro-benchmark: its chase buffer is one cycle through every line, its link and barrier
kernels pass their producer's word along (under the interpreter on CPU, compiled on a GPU), and its
CLI refuses what it cannot time."""

from __future__ import annotations

import pytest
import torch

from engine.bench import handoff, handoff_load
from tests.kernel_helpers import CUDA  # sets TRITON_INTERPRET on CPU before any launch

DEV = torch.device("cuda" if CUDA else "cpu")


def test_the_chase_visits_every_line_once_in_one_cycle():
    lines = 257
    buf = handoff_load.chase_cycle(lines, torch.device("cpu"), seed=3).tolist()
    assert len(buf) == lines * handoff_load.LINE_WORDS
    assert all(w == 0 for i, w in enumerate(buf) if i % handoff_load.LINE_WORDS)  # one word a line
    seen, p = [], 0
    for _ in range(lines):
        p = buf[p]
        assert p % handoff_load.LINE_WORDS == 0
        seen.append(p)
    assert sorted(seen) == [i * handoff_load.LINE_WORDS for i in range(lines)] and p == 0
    assert seen != sorted(seen)  # random order: nothing for a prefetcher to follow


@pytest.mark.parametrize("load", [False, True])
def test_a_chain_of_links_passes_the_word_from_launch_to_launch(load):
    word = torch.zeros(2, dtype=torch.int32, device=DEV)
    handoff.link_chain(word, programs=2, links=5, load=load, pdl=False)()
    assert word[0].item() == (5 if load else 0)


def test_the_grid_barrier_counts_every_arrival_and_hands_program_0s_word_on():
    programs = 1 if not CUDA else 64  # the interpreter runs programs one after another: one only
    count = torch.zeros(1, dtype=torch.int32, device=DEV)
    word = torch.full((1 + programs,), -1, dtype=torch.int32, device=DEV)
    handoff.barrier_chain(count, word, programs, 7, load=True)
    assert count.item() == 7 * programs
    assert word[1:].tolist() == [7] * programs  # each read the word after the last barrier


def test_the_report_gives_each_row_its_unit_and_spread():
    rows = [handoff._row("pdl", 132, True, "us", [1.0, 2.0, 4.0]), handoff._row("chase L2", 1, True, "ns", [600.0])]
    table = handoff.report(rows)
    assert "| pdl | 132 | yes | 2.00 us | 1.00 … 4.00 |  |" in table
    assert "| chase L2 | 1 | yes | 600.00 ns | 600.00 … 600.00 |  |" in table
    walk = rows[1] | handoff_load.hop_quantiles(torch.tensor([100.0] * 8 + [500.0] * 2))
    assert "| 100 / 100 / 500 ns |" in handoff.report([walk])  # a mix shows at the 90th percentile


def test_the_cli_refuses_bad_counts_and_a_host_without_a_gpu(monkeypatch):
    with pytest.raises(SystemExit, match=">= 1"):
        handoff.main(["--links", "0"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="no|none"):
        handoff.main([])


def test_a_grid_too_large_to_be_resident_is_refused_before_anything_runs(monkeypatch):
    """A barrier over programs that cannot all be resident would spin forever: refused up front."""
    sm4 = type("Props", (), {"multi_processor_count": 4})()
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: sm4)
    with pytest.raises(SystemExit, match="at most 64"):
        handoff.measure(torch.device("cuda"), [2, 65], links=1, repeats=1)


@pytest.mark.skipif(not CUDA, reason="times a CUDA GPU")
def test_every_row_is_measured_on_the_gpu():
    rows = handoff.measure(DEV, [8], links=64, repeats=2)
    kinds = {(r["kind"], r["load"]) for r in rows}
    assert {("pdl", False), ("nopdl", True), ("barrier", True)} <= kinds
    assert {"stream alone, 4 warps a program", "chase L2", "chase HBM beside the stream"} <= {r["kind"] for r in rows}
    assert {48, 66} <= {r["programs"] for r in rows if r["kind"] == "stream alone, 16 warps a program"}
    # a barrier row is a difference of two launches' times (it can read <= 0 at few links); the others are not
    assert all(r["median"] > 0 for r in rows if r["kind"] != "barrier")
    walks = [r for r in rows if r["kind"].startswith("chase")]
    assert all(0 < r["hop_p10"] <= r["hop_p50"] <= r["hop_p90"] for r in walks)
