"""`python -m engine.bench tau-context` on the shipped tiny pair: the report's shape, τ >= 1 per context,
and contexts past the models' position limit refused before anything runs."""

from __future__ import annotations

import pytest

from engine.bench.report import read_csv
from engine.bench.tau_context import check_contexts, main

WIDTH = 7  # the tiny drafter: block 8, anchor-drop


def test_tau_per_context_on_the_tiny_pair(tmp_path):
    out = tmp_path / "out"
    argv = ["--contexts", "64", "160", "--prompts", "2", "--new-tokens", "16", "--ngram"]
    assert main([*argv, "--out", str(out)]) == 0
    rows, summary = read_csv(out / "tau_context.csv"), read_csv(out / "tau_context_summary.csv")
    assert [r["context"] for r in rows] == ["64", "160"] * 2  # per file, each context: windows ending at one cut
    assert rows[0]["source"] == rows[1]["source"] != rows[2]["source"] == rows[3]["source"]
    assert [(s["context"], s["prompts"]) for s in summary] == [("64", "2"), ("160", "2")]
    for s in summary:
        assert int(s["rounds"]) > 0 and float(s["tau"]) >= 1.0 and float(s["ngram_tau"]) >= 1.0
        assert float(s["tau_min"]) <= float(s["tau_mean"]) <= float(s["tau_max"])
        shares = [float(s[f"ge{j}"]) for j in range(1, WIDTH + 1)]
        assert all(0.0 <= b <= a <= 1.0 for a, b in zip(shares, shares[1:], strict=False))
        assert f"ge{WIDTH + 1}" not in s
        # τ = 1 + mean accepted drafts = 1 + the sum of the shares accepting >= j (no EOS cuts a round)
        assert float(s["tau"]) == pytest.approx(1 + sum(shares), rel=1e-9)
    assert "| context | prompts | rounds | tau |" in (out / "tau_context.md").read_text()


def test_contexts_past_the_position_limit_are_refused(tmp_path):
    check_contexts([1, 1912], new_tokens=128, block=8, limit=2048)  # 1912 + 128 + 8 = 2048: the last that fits
    with pytest.raises(ValueError, match="context 0: a prompt needs at least one token"):
        check_contexts([0], new_tokens=128, block=8, limit=2048)
    with pytest.raises(ValueError, match=r"context 1913 .* = 2049 exceeds .* 2048 \(longest context: 1912\)"):
        check_contexts([128, 1913], new_tokens=128, block=8, limit=2048)
    with pytest.raises(SystemExit, match=r"context 2048 \+ 128 new tokens .* max_position_embeddings 2048"):
        main(["--contexts", "128", "2048", "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()
