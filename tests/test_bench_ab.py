"""scripts/ab, the developer's A/B of two builds: its pairing and ratios, its refusals, two commits
of a throwaway repository checked out and compared, and this checkout against itself on the tiny
geometry (CPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.bench.report import read_csv
from scripts.ab.__main__ import main, parse
from scripts.ab.pairs import Metric, markdown, paired_ratios, schedule, summarize

ROOT = Path(__file__).resolve().parent.parent


def test_pairs_alternate_which_build_runs_first():
    assert schedule(3) == [(0, "base"), (0, "head"), (1, "head"), (1, "base"), (2, "base"), (2, "head")]
    with pytest.raises(ValueError, match="at least one pair"):
        schedule(0)


def test_ratios_are_paired_and_summarized_with_their_spread():
    values = {
        (0, "base"): {"c=1": 100.0, "c=8": 400.0},
        (0, "head"): {"c=1": 110.0, "c=8": 380.0},
        (1, "head"): {"c=1": 90.0, "c=8": 420.0},
        (1, "base"): {"c=1": 100.0, "c=8": 400.0},
        (2, "base"): {"c=1": 50.0, "c=8": 400.0},
        (2, "head"): {"c=1": 60.0, "c=8": 404.0},
    }
    assert paired_ratios(values) == {"c=1": [1.1, 0.9, 1.2], "c=8": [0.95, 1.05, 1.01]}
    one, eight = summarize(values)
    assert (one["key"], one["ratio"], one["min"], one["max"], one["pairs"]) == ("c=1", 1.1, 0.9, 1.2, 3)
    assert (one["base"], one["head"]) == (100.0, 90.0)  # medians of each build's own values
    assert eight["ratio"] == 1.01
    text = markdown([one, eight], Metric.parse("decode_summary.csv:tok_s", ["concurrency"]))
    assert "decode_summary.csv:tok_s" in text and text.count("(straddles 1)") == 2


def test_pairs_that_disagree_on_their_rows_or_divide_by_zero_are_refused():
    with pytest.raises(ValueError, match="different rows"):
        paired_ratios({(0, "base"): {"a": 1.0}, (0, "head"): {"b": 1.0}})
    with pytest.raises(ValueError, match="base is 0"):
        paired_ratios({(0, "base"): {"a": 0.0}, (0, "head"): {"a": 1.0}})


def test_a_metric_reads_one_value_per_key_row(tmp_path):
    (tmp_path / "s.csv").write_text("impl,concurrency,tok_s,note\npegaspec,1,10.5,x\npegaspec,8,80,y\n")
    metric = Metric.parse("s.csv:tok_s", ["impl", "concurrency"])
    assert metric.read(tmp_path, 3.0) == {"impl=pegaspec concurrency=1": 10.5, "impl=pegaspec concurrency=8": 80.0}
    assert Metric.parse("wall").read(tmp_path, 3.0) == {"": 3.0}
    with pytest.raises(ValueError, match="two rows at"):
        Metric.parse("s.csv:tok_s").read(tmp_path, 0)
    with pytest.raises(ValueError, match="no column nope"):
        Metric.parse("s.csv:nope").read(tmp_path, 0)
    with pytest.raises(ValueError, match="is not a number"):
        Metric.parse("s.csv:note", ["concurrency"]).read(tmp_path, 0)
    with pytest.raises(ValueError, match="wrote no other.csv"):
        Metric.parse("other.csv:tok_s").read(tmp_path, 0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--base", "a", "--head", "b", "--out", "o"], "give the bench command after --"),
        (["--base", "a", "--head", "b", "--out", "o", "--"], "give the bench command after --"),
        (["--base", "a", "--head", "b", "--out", "o", "--repeats", "0", "--", "true"], "--repeats 0 must be >= 1"),
        (["--base", "a", "--head", "b", "--out", "o", "--warmup", "-1", "--", "true"], "--warmup -1 >= 0"),
        (["--base", "a", "--head", "b", "--out", "o", "--metric", "tok_s", "--", "true"], "wall or FILE:COLUMN"),
        (["--base", "a", "--head", "b", "--out", "o", "--key", "c", "--", "true"], "--key needs a FILE:COLUMN"),
        (["--base", "a", "--head", "b", "--out", "o", "--metric", "s.csv:x", "--", "true"], "must write there"),
    ],
)
def test_bad_options_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_a_build_that_is_neither_a_commit_nor_a_checkout_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="neither a directory nor a commit"):
        main(["--base", "no-such-rev-xyz", "--head", str(ROOT), "--out", str(tmp_path / "o"), "--", "true"])
    with pytest.raises(SystemExit, match="no engine/ package there"):
        main(["--base", str(ROOT), "--head", str(tmp_path / "empty"), "--out", str(tmp_path / "o2"), "--", "true"])


def _git(repo: Path, *args: str) -> str:
    cmd = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()


def test_two_commits_are_checked_out_compared_and_removed(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / "engine").mkdir(parents=True)
    _git(repo, "init", "-q")
    shas = []
    for value in (2, 3):
        (repo / "engine" / "__init__.py").write_text(f"VALUE = {value}\n")
        _git(repo, "add", ".")
        _git(repo, "commit", "-qm", f"v{value}")
        shas.append(_git(repo, "rev-parse", "HEAD"))
    probe = (
        "import engine, os, sys; "
        "open(sys.argv[1] + '/v.csv', 'w').write(f'v,sha\\n{engine.VALUE},{os.environ[\"PEGASPEC_COMMIT\"]}\\n')"
    )
    out = tmp_path / "ab"
    monkeypatch.chdir(tmp_path)  # a relative --out: the runs write there, not under their build
    argv = ["--base", "HEAD~1", "--head", "HEAD", "--repo", str(repo), "--out", "ab", "--repeats", "2"]
    assert main([*argv, "--metric", "v.csv:v", "--", sys.executable, "-c", probe, "{out}"]) == 0
    summary = json.loads((out / "ab.json").read_text())["summary"]
    assert [(s["ratio"], s["min"], s["max"], s["pairs"]) for s in summary] == [(1.5, 1.5, 1.5, 2)]
    assert [r["build"] for r in read_csv(out / "ab.csv")] == ["base", "head", "head", "base"]
    for name, sha in (("base", shas[0]), ("head", shas[1])):  # each run saw its own build and commit
        assert read_csv(out / "runs" / f"{name}-1" / "v.csv")[0]["sha"] == sha
    assert len(_git(repo, "worktree", "list").splitlines()) == 1  # the temporary worktrees are gone
    with pytest.raises(SystemExit, match="give a fresh --out"):
        main([*argv, "--", "true"])


def test_a_failing_run_names_its_log(tmp_path):
    argv = ["--base", str(ROOT), "--head", str(ROOT), "--out", str(tmp_path), "--repeats", "1"]
    with pytest.raises(SystemExit, match="base .* exited 3: see .*base-0.log"):
        main([*argv, "--", sys.executable, "-c", "raise SystemExit(3)"])


def test_this_checkout_against_itself_on_the_tiny_profile(tmp_path, capsys):
    bench = [sys.executable, "-m", "engine.bench", "profile", "--geometry", "tiny", "--device", "cpu"]
    bench += ["--batches", "1", "--spans", "2", "--context", "8", "--repeats", "1", "--iters", "1", "--out", "{out}"]
    argv = ["--base", str(ROOT), "--head", str(ROOT), "--out", str(tmp_path), "--repeats", "1"]
    assert main([*argv, "--metric", "profile.csv:ms", "--key", "kind", "batch", "span", "--", *bench]) == 0
    rows = json.loads((tmp_path / "ab.json").read_text())["summary"]
    keys = sorted(r["key"] for r in rows)
    # the drafter with its head over every draft and over the one draft span 2 verifies
    assert keys[:2] == ["kind=draft batch=1 span=1", "kind=draft batch=1 span=7"]
    assert keys[2:] == ["kind=verify batch=1 span=1", "kind=verify batch=1 span=2"]
    assert all(r["pairs"] == 1 and r["ratio"] > 0 for r in rows)
    assert "head / base" in (tmp_path / "ab.md").read_text() and "kind=draft" in capsys.readouterr().out


def test_the_tool_runs_as_a_module_from_the_checkout():
    run = subprocess.run([sys.executable, "-m", "scripts.ab", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.startswith("usage: python -m scripts.ab")
