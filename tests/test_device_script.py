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
