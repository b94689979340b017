"""`python -m engine.bench policy-cost`: the policy's host cost per round, written as CSV."""

from __future__ import annotations

import pytest

from engine.bench.__main__ import main
from engine.bench.report import read_csv


def test_writes_one_row_per_table_batch_waiting_and_draining(tmp_path):
    out = tmp_path / "cost.csv"
    assert main(["policy-cost", "--batches", "1", "8", "--drafts", "7", "--rounds", "40", "--out", str(out)]) == 0
    rows = read_csv(out)
    cells = [(b, "7", d) for b in ("1", "8") for d in ("0", "1")]
    assert [(r["rounds"], r["batch"], r["drafts"], r["draining"]) for r in rows] == [
        (kind, *cell) for kind in ("speculating", "gated") for cell in cells
    ]
    assert all(float(r["us_median"]) > 0 for r in rows)
    # the two tables do what they are named for: every round speculates, or every round is gated
    assert {(r["rounds"], float(r["gated_share"])) for r in rows} == {("speculating", 0.0), ("gated", 1.0)}
    # gated rounds plan their successor off the critical path; speculating rounds decide in turn
    assert all((float(r["planned_us_median"]) > 0) == (r["rounds"] == "gated") for r in rows)


@pytest.mark.parametrize("args", [["--batches", "0"], ["--drafts", "0"], ["--rounds", "5"]])
def test_bad_options_are_refused(args):
    with pytest.raises(SystemExit, match="must be"):
        main(["policy-cost", *args])
