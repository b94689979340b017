"""The preemption-vs-reservation bench end to end on CPU with the tiny pair."""

from __future__ import annotations

import json

import pytest

from engine.bench import preempt
from engine.bench.report import read_csv


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    lines = [json.dumps({"ids": [(7 * i + j) % 290 for j in range(5 + i)]}) for i in range(4)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_preempt_bench_writes_both_arms(tiny_target, tiny_drafter, prompts_file, tmp_path, one_thread, capsys):
    argv = ["--target", str(tiny_target), "--drafter", str(tiny_drafter), "--prompts", str(prompts_file)]
    argv += ["--out", str(tmp_path), "--concurrency", "4", "--new-tokens", "24", "--pool-requests", "2"]
    argv += ["--rounds", "1", "--device", "cpu"]
    assert preempt.main(argv) == 0
    rows = read_csv(tmp_path / "preempt.csv")
    assert sorted(r["arm"] for r in rows) == ["preempt", "reserve"]
    by_arm = {r["arm"]: r for r in rows}
    assert int(by_arm["reserve"]["preemptions"]) == 0
    assert int(by_arm["reserve"]["max_decode_batch"]) <= 2  # the pool holds two reserved budgets
    assert int(by_arm["preempt"]["max_decode_batch"]) > 2  # admission on the prompt runs more at once
    assert all(int(r["output_tokens"]) == 4 * 24 for r in rows)
    md = (tmp_path / "preempt.md").read_text()
    assert "preempt" in md and "reserve" in md and "commit:" in md
    assert "vs reserve" in capsys.readouterr().out


def test_preempt_bench_refuses_bad_values(tmp_path):
    with pytest.raises(SystemExit, match="--pool-requests must be >= 1"):
        preempt.main(["--recipe", "small", "--out", str(tmp_path), "--pool-requests", "0"])
