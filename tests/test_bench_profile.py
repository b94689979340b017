"""The cost profile on the tiny geometry (random weights, CPU): its rows, marks and summary line."""

from __future__ import annotations

import json

import pytest

from engine.bench import profile
from engine.bench.report import read_csv

pytestmark = pytest.mark.usefixtures("one_thread")


def test_profile_tiny_geometry_produces_its_rows(tmp_path, capsys):
    argv = ["--geometry", "tiny", "--out", str(tmp_path), "--device", "cpu", "--batches", "2", "--spans", "3"]
    argv += ["--context", "8", "--repeats", "1", "--iters", "1"]
    assert profile.main(argv) == 0
    rows = read_csv(tmp_path / "profile.csv")
    verify = {(int(r["batch"]), int(r["span"])) for r in rows if r["kind"] == "verify"}
    assert verify == {(b, s) for b in (1, 2) for s in (1, 3)}  # batch 1 / span 1 always: the 1-row reference
    draft = {(int(r["batch"]), int(r["span"])) for r in rows if r["kind"] == "draft"}
    full = max(s for _, s in draft)  # the full head, then the head over the 2 drafts span 3 verifies
    assert draft == {(b, s) for b in (1, 2) for s in (full, 2)} and full > 2
    for r in rows:
        assert float(r["ms"]) > 0 and float(r["ms_min"]) <= float(r["ms"]) <= float(r["ms_max"])
        assert int(r["rows"]) == int(r["batch"]) * int(r["span"])
    one = next(float(r["ms"]) for r in rows if r["kind"] == "verify" and r["rows"] == "1")
    for r in rows:
        if r["kind"] == "verify":
            assert (r["over"] == "True") == (float(r["ms"]) > 1.2 * one)
    out = capsys.readouterr().out
    assert "verify cost within 1.2x of one row up to" in out
    meta = json.loads((tmp_path / "profile.json").read_text())
    assert meta["geometry"] == "tiny" and meta["command"].startswith("python -m engine.bench profile")
    assert (tmp_path / "profile.md").read_text().count("|") > 10


def _row(batch, span, ms):
    return {"kind": "verify", "batch": batch, "span": span, "rows": batch * span, "ms": ms}


def test_free_rows_is_the_largest_all_within_prefix():
    rows = [_row(1, 1, 2.0), _row(1, 8, 2.1), _row(8, 8, 2.3), _row(16, 8, 2.6), _row(32, 8, 4.0), _row(4, 1, 2.0)]
    assert profile.mark_over(rows, 1.2) == 2.0
    assert [r["over"] for r in rows] == [False, False, False, True, True, False]
    n, first = profile.free_rows(rows)
    assert (n, first["rows"]) == (64, 128)
    line = profile.summary_line(rows, 1.2)
    assert line.startswith("verify cost within 1.2x of one row up to 64 rows; first over: 128 rows (batch 16 x span 8)")
    assert line.endswith("1.30x")


def test_free_rows_when_nothing_is_over():
    rows = [_row(1, 1, 2.0), _row(2, 2, 2.1)]
    profile.mark_over(rows, 1.2)
    assert profile.free_rows(rows) == (4, None)
    assert profile.summary_line(rows, 1.2).endswith("(every measured point)")


def test_profile_rejects_an_unknown_geometry(tmp_path):
    with pytest.raises(SystemExit, match="not one of"):
        profile.main(["--geometry", str(tmp_path / "nope"), "--out", str(tmp_path), "--device", "cpu"])
