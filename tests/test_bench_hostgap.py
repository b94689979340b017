"""The host-gap bench: the engine work between the timed steps, part by part, timed from outside."""

from __future__ import annotations

import argparse

import pytest
import torch

from engine.bench.common import make_engine, random_prompts
from engine.bench.geometry import QWEN3_4B
from engine.bench.hostgap import PARTS, gap_runs, main
from engine.bench.known_pair import known_target
from engine.bench.report import read_csv

pytestmark = pytest.mark.usefixtures("one_thread")

MICRO = {**QWEN3_4B, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2}
MICRO |= {"num_key_value_heads": 1, "head_dim": 32, "vocab_size": 512, "num_hidden_layers": 1}


def test_the_parts_lie_between_the_timed_steps_and_the_wrappers_come_off():
    args = argparse.Namespace(dtype="float32", backend="torch", no_cuda_graphs=True)
    engine = make_engine(
        known_target(MICRO, torch.device("cpu"), torch.float32),
        None,
        args,
        torch.device("cpu"),
        max_num_seqs=3,
        seq_tokens=24,
    )
    rows = gap_runs(engine, random_prompts(9, 4, 512, seed=1), c=3, runs=2, new_tokens=18)  # 18 + 4: a block grows
    assert [r["run"] for r in rows] == [0, 1]
    for r in rows:
        assert all(r[f"{p}_ms"] > 0 for p in PARTS), r
        assert r["rest_ms"] >= -1e-6  # disjoint from the steps, inside the wall
        assert r["gap_ms"] == pytest.approx(r["wall_ms"] - r["steps_ms"])
    wrapped = ("add_request", "_report")
    assert not set(wrapped) & set(vars(engine)) and "schedule" not in vars(engine.scheduler)
    assert "assign_blocks" not in vars(engine.runner)


def test_the_cli_writes_a_row_per_run_and_refuses_bad_values(tmp_path):
    argv = ["--out", str(tmp_path), "--geometry", "tiny", "--concurrency", "2", "--runs", "2", "--new-tokens", "3"]
    assert main([*argv, "--device", "cpu", "--frozen-heap"]) == 0
    rows = read_csv(tmp_path / "hostgap.csv")
    assert len(rows) == 2 and {r["concurrency"] for r in rows} == {"2"}
    with pytest.raises(SystemExit, match="--new-tokens >= 2"):
        main([*argv[:-1], "1", "--device", "cpu"])
