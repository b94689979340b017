"""serve-load's arithmetic and report, on canned streams and records (no server, no timing)."""

from __future__ import annotations

import argparse
import itertools
import statistics
from pathlib import Path

import pytest

from engine.__main__ import _parser as engine_parser
from engine.bench.arms import parse_arm
from engine.bench.open_loop import RequestRecord, arrival_times, parse_sse
from engine.bench.serve_load import server_command, write_outputs
from engine.bench.serve_stats import markdown, percentile, run_row, summarize
from engine.bench.serve_workload import engine_command

STREAM = [
    b'data: {"choices": [{"index": 0, "text": "def", "finish_reason": null}]}\n',
    b"\n",
    b'data: {"choices": [{"index": 0, "text": "", "finish_reason": null}]}\n',
    b'data: {"choices": [{"index": 0, "text": " main", "finish_reason": null}]}\n',
    b'data: {"choices": [{"index": 0, "text": "():", "finish_reason": "length"}]}\n',
    b'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 7, "total_tokens": 10}}\n',
    b"data: [DONE]\n",
]


def test_percentile_interpolates_like_numpy():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile(list(range(101)), 99) == 99
    assert percentile([5.0], 99) == 5.0 and percentile([], 50) is None


def test_arrivals_are_seeded_poisson():
    a = arrival_times(4.0, 4000, seed=3)
    assert a == arrival_times(4.0, 4000, seed=3) and a != arrival_times(4.0, 4000, seed=4)
    gaps = [y - x for x, y in itertools.pairwise(a)]
    assert a[0] == 0 and min(gaps) > 0
    assert statistics.mean(gaps) == pytest.approx(0.25, rel=0.05)
    assert statistics.stdev(gaps) == pytest.approx(0.25, rel=0.1)  # exponential: sd = mean
    with pytest.raises(ValueError, match="rate"):
        arrival_times(0, 5, seed=0)


def test_stream_parsing_times_chunks_that_carry_text():
    clock = iter([1.0, 1.1, 1.3, 1.6, 1.7, 1.8]).__next__
    record = RequestRecord(sent=0.5)
    parse_sse(STREAM, record, clock)
    assert record.chunks == [1.0, 1.3, 1.6] and record.output_tokens == 7 and record.error is None
    assert record.ttft == pytest.approx(0.5)
    assert record.gaps == pytest.approx([0.3, 0.3])
    assert record.tpot == pytest.approx(0.6 / 6)


def test_an_error_event_marks_the_record():
    record = RequestRecord(sent=0.0)
    parse_sse([b'data: {"error": {"message": "boom"}}\n'], record, lambda: 1.0)
    assert "boom" in record.error


def _record(sent: float, chunks: list[float], tokens: int, error: str | None = None) -> RequestRecord:
    return RequestRecord(
        sent=sent, chunks=chunks, done=chunks[-1] if chunks else sent, output_tokens=tokens, error=error
    )


def test_run_row_counts_only_good_requests_and_derives_tau():
    records = [_record(0.0, [0.1, 0.2, 0.4], 5), _record(1.0, [1.3, 1.4], 4), _record(2.0, [], 0, "HTTP 400")]
    row = run_row(8.0, 0, "spec", records, wall_s=3.0, spec={"rounds": 10, "gated_rounds": 2, "committed_tokens": 26})
    assert (row["requests"], row["errors"], row["output_tokens"]) == (3, 1, 9)
    assert row["output_tok_s"] == pytest.approx(3.0) and row["req_s"] == pytest.approx(2 / 3)
    assert row["ttft_p50_ms"] == pytest.approx(200.0)
    assert row["itl_p50_ms"] == pytest.approx(100.0)
    assert row["tau"] == pytest.approx((26 - 2) / 8)
    assert row["first_error"] == "HTTP 400"


def test_summary_pairs_each_arm_with_the_first_by_repeat():
    def row(arm, repeat, tok_s, ttft):
        keys = ("req_s", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "tpot_p50_ms", "tau")
        return dict(
            rate=2.0, repeat=repeat, arm=arm, errors=0, output_tok_s=tok_s, ttft_p50_ms=ttft, **dict.fromkeys(keys)
        )

    rows = [row("plain", 0, 100, 10), row("spec", 0, 150, 5), row("plain", 1, 200, 10), row("spec", 1, 260, 20)]
    plain, spec = summarize(rows, ["plain", "spec"])
    assert plain["tok_s_vs_first"] == 1.0 and plain["output_tok_s"] == 150
    assert spec["tok_s_vs_first"] == pytest.approx(statistics.median([1.5, 1.3]))
    assert spec["ttft_vs_first"] == pytest.approx(statistics.median([0.5, 2.0]))
    assert (spec["tok_s_min"], spec["tok_s_max"]) == (150, 260)
    table = markdown([plain, spec], "plain")
    assert "× plain" in table and "| 2.0 | spec | 205.0 (150–260) | 1.400 |" in table


def _args(**kw) -> argparse.Namespace:
    base = dict(max_num_seqs=8, max_model_len=300, device="cpu", dtype="auto", backend="auto", no_cuda_graphs=True)
    return argparse.Namespace(**{**base, **kw})


def test_arm_servers_get_explicit_levers_that_the_serve_parser_accepts():
    plain = server_command(engine_command(parse_arm("plain"), Path("t"), Path("d")), 9000, _args())
    assert "--draft-model" not in plain
    spec = server_command(engine_command(parse_arm("spec+trim=4+gate=8"), Path("t"), Path("d")), 9001, _args())
    parsed = engine_parser().parse_args(spec[3:])
    assert (parsed.command, parsed.draft_model, parsed.max_drafts, parsed.max_batch, parsed.hedge) == (
        "serve",
        "d",
        4,
        8,
        0,
    )
    assert (parsed.port, parsed.max_model_len, parsed.no_cuda_graphs) == (9001, 300, True)


def test_outputs_are_written(tmp_path):
    rows = [run_row(2.0, 0, "plain", [_record(0.0, [0.1, 0.2], 2)], 1.0, {})]
    summary = summarize(rows, ["plain"])
    meta = {"command": "x", "device": "cpu", "torch": "t", "triton": None, "commit": "abc", "date": "d"}
    meta.update(transformers=None, cuda=None, host="h", python="3")
    write_outputs(tmp_path, rows, summary, ["plain"], meta)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["serve_load.csv", "serve_load.json", "serve_load.md", "serve_load_summary.csv"]
    assert "| 2.0 | plain |" in (tmp_path / "serve_load.md").read_text()
