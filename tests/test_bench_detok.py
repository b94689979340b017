"""`python -m engine.bench detok`: its four arms run and report, and each "before" arm computes what
its incremental replacement does (so the figures compare like with like); no timing is asserted."""

from __future__ import annotations

import inspect

from engine.bench.detok import _arms, main


def test_the_bench_reports_every_arm(capsys):
    assert main(["--tokens", "40", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "python -m engine.bench detok --tokens 40 --repeats 1" in out and "tokens 1-40" in out
    for arm in ("stop scan, whole decode", "stop scan, incremental", "streamed text, whole decode"):
        assert f"| {arm}" in out
    assert "| streamed text, incremental |" in out


def test_before_and_after_arms_agree():
    from transformers import AutoTokenizer

    from engine.shipped import shipped_pair

    tokenizer = AutoTokenizer.from_pretrained(str(shipped_pair("tiny")[0]))
    ids = tokenizer.encode(inspect.getsource(inspect)[:3000] + " x @@never@@ y", add_special_tokens=False)
    calls = [make() for make in _arms(tokenizer).values()]
    results = [[call(ids[:n]) for n in range(1, len(ids) + 1)] for call in calls]
    assert results[0] == results[1] and results[2] == results[3]
    assert any(r is not None for r in results[0])  # the stop string is found, at the same token
