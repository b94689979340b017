"""The spread summary over builds: τ from manifests, the c=1 ratio from sweep summaries, same-seed hashes."""

from __future__ import annotations

import json

import pytest

from engine.bench.report import read_csv, write_csv
from engine.bench.spread import main

SUMMARY = [
    {"concurrency": 1, "arm": "plain", "ratio_median": 1.0, "noise_floor": 0.05, "tokens_per_round": ""},
    {"concurrency": 1, "arm": "spec", "ratio_median": 2.0, "noise_floor": 0.05, "tokens_per_round": 3.9},
    {"concurrency": 1, "arm": "spec#2", "ratio_median": 1.0, "noise_floor": 0.12, "tokens_per_round": 3.8},
    {"concurrency": 8, "arm": "spec", "ratio_median": 0.7, "noise_floor": 0.05, "tokens_per_round": 3.9},
]


def _build(root, name, seed, tau, digest, ratio=None):
    pair = root / name
    pair.mkdir()
    manifest = {
        "seed": seed,
        "eval": {"tau": tau, "ngram_tau": 2.0},
        "target_heldout_loss": 2.5,
        "build_seconds": {"total": 270.0},
        "weights_sha256": {"target/model.safetensors": digest, "drafter/model.safetensors": digest},
    }
    (pair / "manifest.json").write_text(json.dumps(manifest))
    if ratio is None:
        return str(pair)
    sweep = root / f"sweep-{name}"
    sweep.mkdir()
    write_csv(sweep / "sweep_summary.csv", [dict(r, ratio_median=ratio) if r["arm"] == "spec" else r for r in SUMMARY])
    return f"{pair}={sweep}"


def test_spread_over_three_seeds_and_a_repeat(tmp_path):
    builds = [
        _build(tmp_path, "s0", 0, 4.3, "a" * 64, ratio=2.1),
        _build(tmp_path, "s1", 1, 3.6, "b" * 64, ratio=1.8),
        _build(tmp_path, "s2", 2, 4.0, "c" * 64, ratio=1.9),
        _build(tmp_path, "s0r", 0, 4.3, "a" * 64),
    ]
    assert main(["--builds", *builds, "--out", str(tmp_path / "out")]) == 0
    rows = read_csv(tmp_path / "out" / "spread.csv")
    assert [r["c1_ratio"] for r in rows] == ["2.1", "1.8", "1.9", ""]
    assert rows[0]["c1_noise"] == "0.12"  # the speculative arm's own noise floor, spec#2's
    summary = {r["figure"]: r for r in read_csv(tmp_path / "out" / "spread_summary.csv")}
    assert (summary["tau"]["n"], summary["tau"]["min"], summary["tau"]["max"]) == ("4", "3.6", "4.3")
    assert (summary["c1_ratio"]["n"], summary["c1_ratio"]["median"]) == ("3", "1.9")
    assert summary["seed 0: builds with identical weights"]["median"] == "1.0"


def test_a_differing_repeat_is_reported_and_an_unreadable_build_is_left_out(tmp_path, caplog):
    builds = [_build(tmp_path, "s0", 0, 4.3, "a" * 64, ratio=2.1), _build(tmp_path, "s0r", 0, 4.2, "d" * 64)]
    assert main(["--builds", *builds, str(tmp_path / "missing"), "--out", str(tmp_path / "out")]) == 0
    summary = {r["figure"]: r for r in read_csv(tmp_path / "out" / "spread_summary.csv")}
    assert summary["seed 0: builds with identical weights"]["median"] == "0.0"
    assert "missing" in caplog.text
    with pytest.raises(SystemExit, match="no build"):
        main(["--builds", str(tmp_path / "missing"), "--out", str(tmp_path / "out2")])
