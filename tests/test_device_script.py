"""scripts/device.sh without a GPU: the stage list, and that an unknown stage, a bad cap and a stage
that fails are each recorded in stages.txt without stopping the stages after them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "device.sh"


def _run(tmp_path: Path, *stages: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PAIR": str(tmp_path / "no-pair")}
    return subprocess.run(["bash", str(SCRIPT), *stages], env=env, capture_output=True, text=True, timeout=60)


def test_list_names_every_stage(tmp_path):
    out = _run(tmp_path, "list").stdout
    names = [line.split()[0] for line in out.splitlines()]
    assert {"gpu-tests", "gates", "small-build", "steps", "sweep", "decode", "profile", "ablate"} <= set(names)
    assert {"serve-load", "serve-load-small", "serve-load-4b"} <= set(names)
    assert not (tmp_path / "out").exists()


def test_failures_are_recorded_and_the_rest_still_run(tmp_path):
    _run(tmp_path, "nosuch", "steps:1x", "steps+eval64", "sweep:5")
    lines = (tmp_path / "out" / "logs" / "stages.txt").read_text().splitlines()
    assert lines[0] == "nosuch unknown stage (bash scripts/device.sh list)"
    assert lines[1] == "steps bad cap '1x' (whole seconds)"
    assert sorted(line.split(" (cap")[0].rsplit(" ", 1)[0] for line in lines[2:4]) == ["eval64 rc=3", "steps rc=3"]
    assert lines[4].startswith("sweep rc=3 ") and lines[4].endswith("(cap 5s)")
    assert "run small-build first" in (tmp_path / "out" / "logs" / "sweep.log").read_text()
    assert (tmp_path / "out" / "logs.tgz").is_file()


def test_one_stage_pinned_to_each_gpu_keeps_both_runs(tmp_path):
    # A study on each GPU once wrote both runs into one logs/study/ (H200 x2, b0194de): each pinned
    # stage now has its own log and output folder.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text('#!/bin/sh\n[ "$1" = -L ] && printf "GPU 0\\nGPU 1\\n" || echo fake\n')
    fake.chmod(0o755)
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PAIR": str(tmp_path / "no-pair")}
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    subprocess.run(["bash", str(SCRIPT), "eval64@0:5+eval64@1:5"], env=env, capture_output=True, timeout=60)
    logs = tmp_path / "out" / "logs"
    for gpu in (0, 1):
        assert "run small-build first" in (logs / f"eval64-g{gpu}.log").read_text()
        assert (logs / f"g{gpu}").is_dir()
    assert sorted(line.split(" rc=")[0] for line in (logs / "stages.txt").read_text().splitlines()) == [
        "eval64@0",
        "eval64@1",
    ]
