"""A study cut short after its sweep is reported from its files: the tiny geometry's study on the CPU,
its report removed, then rebuilt by `engine.bench.study.files` to the same summary."""

from __future__ import annotations

import json
import re

import pytest

from engine.bench.report import read_csv, write_csv
from engine.bench.study.draws import StudyDraws
from engine.bench.study.files import main as files_main
from engine.bench.study.files import typed
from engine.bench.study.run import main as study_main

FLAGS = ["--geometry", "tiny", "--device", "cpu", "--concurrency", "1", "2", "--rounds", "1", "--new-tokens", "4"]
FLAGS += ["--profile-budget-s", "3", "--echo-steps", "8", "--echo-batch", "2", "--calib-steps", "4"]
FLAGS += ["--calib-repeats", "1", "--arms", "spec", "spec+trim=2"]


def test_a_study_is_reported_again_from_its_files(tmp_path, capsys):
    study_main(["--out", str(tmp_path), *FLAGS])
    meta = json.loads((tmp_path / "meta.json").read_text())
    checks = json.loads((tmp_path / "checks.json").read_text())
    assert meta["argv"][-2:] == ["spec", "spec+trim=2"] and meta["buckets"] == []  # eager on the CPU
    assert not checks["echo"]["failures"] and {r["arm"] for r in checks["lossless"]} == {"spec", "spec+trim=2"}
    first, text = read_csv(tmp_path / "summary.csv"), (tmp_path / "study.md").read_text()
    # the replays ran on the modelled drafter's own draws and took the engine's steps in every run
    checked = re.search(r"own draws, per measured round \(replayed on them, (\d+) of (\d+) static", text)
    assert (tmp_path / "draws.npz").is_file() and checked and checked[1] == checked[2] != "0"
    (tmp_path / "summary.csv").unlink()
    (tmp_path / "study.md").unlink()
    assert files_main([str(tmp_path)]) == 0
    assert read_csv(tmp_path / "summary.csv") == first
    assert (tmp_path / "study.md").read_text() == text
    stored = StudyDraws.load(tmp_path)
    (tmp_path / "draws.npz").unlink()  # a run from before the draws were stored: rebuilt from its meta
    assert files_main(["--rebuild-draws", str(tmp_path)]) == 0
    rebuilt = StudyDraws.load(tmp_path)
    assert rebuilt.replicas == stored.replicas and rebuilt.total == stored.total
    assert set(rebuilt.counts) == set(stored.counts)
    assert all((rebuilt.counts[k] == stored.counts[k]).all() for k in stored.counts)
    (tmp_path / "checks.json").unlink()  # a copy without its checks is reported without them
    assert files_main([str(tmp_path)]) == 0
    assert read_csv(tmp_path / "summary.csv") == first
    assert "Echo and lossless checks: not in this run's files" in (tmp_path / "study.md").read_text()
    (tmp_path / "sweep.csv").unlink()  # a run cut before its sweep cannot be reported
    with pytest.raises(SystemExit, match="FileNotFoundError"):
        files_main([str(tmp_path)])


def test_csv_cells_come_back_typed():
    row = typed({"a": "", "b": "3", "c": "2.5", "d": "15:23", "e": "spec+trim=2", "f": "1e-3"})
    assert row == {"a": None, "b": 3, "c": 2.5, "d": "15:23", "e": "spec+trim=2", "f": 0.001}


def test_a_mixed_study_measures_and_predicts_the_budget_arm(tmp_path):
    """The tiny geometry's study on `code+chat` and `spread` with both policies: every class's conditionals in
    meta.json, the budget arm measured (lossless) and predicted in every cell, the replay check on the static
    arms alone, the per-request table in study.md; a cell without rows is named as not measured."""
    flags = [*FLAGS[: FLAGS.index("--concurrency") + 1], "2", *FLAGS[FLAGS.index("--rounds") : FLAGS.index("--arms")]]
    flags += ["--arms", "spec", "spec+policy=adaptive", "spec+policy=budget", "--profiles", "code+chat", "spread"]
    study_main(["--out", str(tmp_path), *flags])
    meta, checks = (json.loads((tmp_path / f).read_text()) for f in ("meta.json", "checks.json"))
    assert list(meta["profiles"]["code+chat"]["classes"]) == ["code", "chat"]
    assert len(meta["profiles"]["spread"]["classes"]) == 8 and len(meta["profiles"]["spread"]["pooled"]) == 7
    assert {r["arm"]: r["mismatches"] for r in checks["lossless"]}["spec+policy=budget"] == 0
    summary = [typed(r) for r in read_csv(tmp_path / "summary.csv")]
    budget = [s for s in summary if s["arm"] == "spec+policy=budget"]
    assert {s["profile"] for s in budget} == {"code+chat", "spread"} and all(s["predicted_tok_s"] for s in budget)
    assert all(s["tau_model"] is None for s in summary)  # no τ model for a mixed profile
    text = (tmp_path / "study.md").read_text()
    checked = re.search(r"replayed on them, (\d+) of (\d+) static", text)
    assert checked and checked[1] == checked[2] == "4"  # spec and spec#2 per profile: the policies not replayed
    assert text.count("Per-request spans against one K") == 2 and "Not measured" not in text
    rows = read_csv(tmp_path / "sweep.csv")
    write_csv(tmp_path / "sweep.csv", [r for r in rows if r["profile"] != "spread"])  # a sweep cut before it
    assert files_main([str(tmp_path)]) == 0
    text = (tmp_path / "study.md").read_text()
    assert "Not measured (no round: the time budget left none, or the run ended): c = [2]" in text
    assert not [r for r in read_csv(tmp_path / "summary.csv") if r["profile"] == "spread"]  # nothing made up
