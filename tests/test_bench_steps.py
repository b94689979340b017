"""The step profiler end to end on CPU with a tiny random pair: every arm, host ops listed, files."""

from __future__ import annotations

import json

import pytest
import torch

from engine.bench import steps
from engine.bench.report import read_csv

NEW = 5

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def profiled(tiny_target, tiny_drafter, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("steps")
    prompts = tmp / "prompts.jsonl"
    gen = torch.Generator().manual_seed(0)
    prompts.write_text(
        "".join(json.dumps({"ids": torch.randint(0, 290, (n,), generator=gen).tolist()}) + "\n" for n in (6, 9))
    )
    out = tmp / "out"
    argv = ["--target", str(tiny_target), "--drafter", str(tiny_drafter), "--prompts", str(prompts)]
    argv += ["--out", str(out), "--concurrency", "2", "--new-tokens", str(NEW), "--device", "cpu", "--top", "5"]
    argv += ["--arms", "plain", "spec", "spec+gate=1"]
    assert steps.main(argv) == 0
    return out, json.loads((out / "steps.json").read_text())


def test_every_arm_profiled(profiled):
    out, data = profiled
    results = data["results"]
    assert list(results) == ["plain", "spec", "spec+gate=1"]
    for r in results.values():
        assert r["steps"] >= 2
        assert r["tokens_per_step"] * r["steps"] == pytest.approx(2 * NEW)  # both requests, EOS ignored
        assert r["wall_ms_per_step"] > 0
        assert r["kernels"] == [] and r["device_idle"] is None  # CPU: no device timeline to report
        assert 0 < len(r["host"]) <= 5
        assert all(op["calls_per_step"] > 0 for op in r["host"])
    rows = read_csv(out / "steps.csv")
    assert {r["arm"] for r in rows} == set(results) and {r["kind"] for r in rows} == {"host"}
    md = (out / "steps.md").read_text()
    assert (
        "wall ms/step" in md
        and "spec: top host ops" in md
        and data["command"].startswith("python -m engine.bench steps")
    )


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--arms", "plain", "spec+gate=x"], "--arms: arm 'spec\\+gate=x': bad lever"),
        (["--concurrency", "0"], "--concurrency and --new-tokens must be >= 1"),
        (["--new-tokens", "0"], "--concurrency and --new-tokens must be >= 1"),
        (["--arms", "plain", "spec"], "spec arms need --drafter"),
    ],
)
def test_bad_arguments_are_refused_by_name(tiny_target, tmp_path, extra, message):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"ids": [1, 2, 3]}) + "\n")
    argv = ["--target", str(tiny_target), "--prompts", str(prompts), "--out", str(tmp_path / "o"), "--device", "cpu"]
    with pytest.raises(SystemExit, match=message):
        steps.main(argv + extra)
