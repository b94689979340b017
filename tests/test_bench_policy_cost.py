"""`python -m engine.bench policy-cost`: the policy's host cost per round, written as CSV."""

from __future__ import annotations

import pytest

from engine.bench.__main__ import main
from engine.bench.report import read_csv


def test_writes_one_row_per_batch_waiting_and_draining(tmp_path):
    out = tmp_path / "cost.csv"
    assert main(["policy-cost", "--batches", "1", "8", "--drafts", "7", "--rounds", "40", "--out", str(out)]) == 0
    rows = read_csv(out)
    assert [(r["batch"], r["drafts"], r["draining"]) for r in rows] == [
        ("1", "7", "0"),
        ("1", "7", "1"),
        ("8", "7", "0"),
        ("8", "7", "1"),
    ]
    assert all(float(r["us_median"]) > 0 for r in rows)


@pytest.mark.parametrize("args", [["--batches", "0"], ["--drafts", "0"], ["--rounds", "5"]])
def test_bad_options_are_refused(args):
    with pytest.raises(SystemExit, match="must be"):
        main(["policy-cost", *args])
