"""Memory planned, never hit (SPEC 10): the engine refuses a KV pool that cannot hold one request of
max_model_len, a bench refuses a grid over the budget (naming it, the bytes needed and free) before it
builds or times anything, two engines share one pool, and a prefill is timed without a logits row per
prompt token."""

from __future__ import annotations

import argparse
import re

import pytest
import torch

from engine.bench import common
from engine.bench.arms import parse_arms
from engine.bench.profile import time_prefills
from engine.bench.report import read_csv
from engine.bench.study import run as study
from engine.bench.study.contexts import ContextRun, best_cells, crossovers, fit_grid, write_contexts
from engine.config import EngineConfig, SamplingParams
from engine.engine import Engine
from engine.memory import KVBudgetError

ARGS = argparse.Namespace(dtype="auto", backend="auto", no_cuda_graphs=True, gpu_memory_utilization=0.9)
CPU = torch.device("cpu")


def test_an_explicit_pool_that_cannot_hold_one_request_of_max_model_len_is_refused(tiny_target):
    cfg = dict(model=str(tiny_target), device="cpu", kv_block_size=16, max_model_len=64)
    with pytest.raises(KVBudgetError, match=r"pool of 4 blocks .* max_model_len \(64 tokens\): that needs 5 blocks"):
        Engine(EngineConfig(**cfg, num_kv_blocks=4))
    assert issubclass(KVBudgetError, ValueError)
    assert Engine(EngineConfig(**cfg, num_kv_blocks=5)).blocks.capacity == 4  # exactly one request


def test_a_budget_that_cannot_hold_one_request_is_refused_before_the_pool_is_allocated(tiny_target, monkeypatch):
    monkeypatch.setattr("engine.memory.CPU_KV_BUDGET", 1000)

    def allocate(*a, **k):
        raise AssertionError("the pool was allocated")

    monkeypatch.setattr("engine.runner.allocate_kv_cache", allocate)
    with pytest.raises(KVBudgetError, match=r"holds 0 blocks, but one request of max_model_len \(64 tokens\) needs 5"):
        Engine(EngineConfig(model=str(tiny_target), device="cpu", kv_block_size=16, max_model_len=64))


def _refuse_building(monkeypatch):
    def built(*a, **k):
        raise AssertionError("an engine was built (or something timed) before the grid was refused")

    monkeypatch.setattr(common, "Engine", built)
    monkeypatch.setattr(study, "make_engine", built)
    monkeypatch.setattr(study, "measure_costs", built)


def test_a_bench_grid_over_the_budget_is_refused_naming_it_and_the_bytes(tiny_target, tiny_drafter, monkeypatch):
    monkeypatch.setattr(common, "memory_budget", lambda device, share: (123_456, "a test budget"))
    _refuse_building(monkeypatch)
    with pytest.raises(SystemExit) as err:
        common.engine_pair(tiny_target, tiny_drafter, ARGS, CPU, max_num_seqs=64, seq_tokens=4000)
    per_block = common.pool_block_bytes(tiny_target, tiny_drafter, torch.float32)
    blocks = 64 * -(-(4000 + common.drafter_block(tiny_drafter) + 1) // 16) + 1
    msg = str(err.value)
    assert f"the grid 64 sequences of {4000 + common.drafter_block(tiny_drafter) + 1} tokens" in msg
    assert f"needs {blocks * per_block:,} bytes" in msg and "but 123,456 bytes are free (a test budget)" in msg


def test_the_study_refuses_its_prompt_length_by_c_grid_before_it_builds_or_times_anything(monkeypatch, tmp_path):
    monkeypatch.setattr(study, "memory_budget", lambda device, share: (10**6, "a test budget"))
    _refuse_building(monkeypatch)
    argv = ["--geometry", "tiny", "--device", "cpu", "--out", str(tmp_path), "--prompt-lens", "2048", "8192"]
    with pytest.raises(SystemExit) as err:
        study.main([*argv, "--concurrency", "1", "8", "64"])
    msg = str(err.value)
    assert "the grid [2048, 8192] prompt tokens x c=[1, 8, 64] (largest cell: 8192 x c=64" in msg
    need = int(re.search(r"needs ([\d,]+) bytes", msg).group(1).replace(",", ""))
    assert need > 10**6 and "but 1,000,000 bytes are free (a test budget)" in msg


def test_two_engines_on_one_pool_give_the_same_tokens_and_free_every_block(tiny_target, tiny_drafter, one_thread):
    engines = common.engine_pair(tiny_target, tiny_drafter, ARGS, CPU, max_num_seqs=2, seq_tokens=24)
    plain, spec = engines["plain"], engines["spec"]
    assert all(p[0] is s[0] and p[1] is s[1] for p, s in zip(plain.runner.kv, spec.runner.kv, strict=True))
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    prompts = [[5, 6, 7, 8], [9, 10, 11], [3] * 7]
    ids = {k: [o.token_ids for o in e.generate(prompts, params)] for k, e in engines.items()}
    assert ids["plain"] == ids["spec"]
    for e in (plain, spec):
        assert e.blocks.num_free == e.blocks.capacity and not e.has_unfinished()
    spec.add_request([1, 2, 3], params)
    with pytest.raises(RuntimeError, match="an engine on this KV pool still holds requests"):
        plain.add_request([1, 2, 3], params)
    while spec.has_unfinished():
        spec.step()
    assert plain.generate([[1, 2, 3]], params)[0].token_ids


def test_a_shared_pool_too_small_for_the_engines_max_model_len_is_refused(tiny_target, tiny_drafter):
    spec = common.make_engine(tiny_target, tiny_drafter, ARGS, CPU, max_num_seqs=1, seq_tokens=24, headroom=8)
    with pytest.raises(KVBudgetError, match="cannot hold one request of max_model_len"):
        common.make_engine(tiny_target, None, ARGS, CPU, max_num_seqs=1, seq_tokens=200, kv_from=spec)


def test_the_timed_prefill_computes_logits_at_each_prompts_last_row_only(tiny_target, tiny_drafter, one_thread):
    engine = common.make_engine(tiny_target, tiny_drafter, ARGS, CPU, max_num_seqs=4, seq_tokens=64, headroom=8)
    target, rows = engine.runner.target, []
    real = target.logits

    def logits(hidden, *a, **k):
        rows.append(hidden.shape[0])
        return real(hidden, *a, **k)

    target.logits = logits
    try:
        got = time_prefills(engine, [1, 4], prompt_len=48, repeats=1)
    finally:
        del target.logits
    assert [(r["kind"], r["batch"], r["span"]) for r in got] == [("prefill", 1, 48), ("prefill", 4, 48)]
    assert rows and max(rows) <= 4  # a row per request, never 48 per prompt
    assert not engine.has_unfinished() and engine.blocks.num_free == engine.blocks.capacity
    per_round = engine.drafts_per_round
    assert max(study.study_spans(parse_arms(["plain", "spec", "spec+policy=adaptive"]), per_round)) <= 1 + per_round


def test_the_context_grid_is_sized_by_its_largest_cell_and_reported_per_context(tmp_path):
    seqs = {2048: 2400, 8192: 8600}
    assert fit_grid([8, 1, 64], seqs, 9, 100, (10**9, "b"), 0) == 64 * -(-(8600 + 10) // 16)
    with pytest.raises(SystemExit, match=r"\[2048, 8192\] prompt tokens x c=\[1, 64\] \(largest cell: 8192 x c=64"):
        fit_grid([1, 64], seqs, 9, 100, (10**6, "b"), 0)

    def cell(n, c, arm, tok_s, verdict):
        return dict(profile="code", concurrency=c, arm=arm, tok_s=tok_s, ratio_median=tok_s / 100, verdict=verdict)

    summaries = {
        n: [cell(n, c, "plain", 100, "baseline") for c in (1, 8, 64)]
        + [cell(n, 1, "spec", 150, "win"), cell(n, 8, "spec", 120 if n == 2048 else 90, "win" if n == 2048 else "loss")]
        + [cell(n, 64, "spec", 80, "loss")]
        for n in (2048, 8192)
    }
    meta = dict.fromkeys(("command", "device", "torch", "triton", "transformers", "commit", "date"), "x")
    write_contexts(tmp_path, meta, summaries, [1, 8, 64])
    rows = read_csv(tmp_path / "contexts.csv")
    got = [(r["concurrency"], r["best"]) for r in rows if r["context"] == "8192"]
    assert got == [("1", "spec"), ("8", "plain"), ("64", "plain")]
    assert crossovers(best_cells(summaries)) == [[2048, "code", 64, 8], [8192, "code", 8, 1]]
    assert "Crossover per context" in (tmp_path / "contexts.md").read_text()
    args = argparse.Namespace(out=tmp_path, prompt_len=16, prompt_lens=[2048, 8192], concurrency=[1, 8])
    run = ContextRun(args, 8192, [1, 8], ["--x"], nested=True)
    assert run.args.out == tmp_path / "prompt-8192" and run.args.prompt_lens == [8192] and run.batches == [1, 8]
    assert run.argv[-4:] == ["--prompt-len", "8192", "--prompt-lens", "8192"] and args.prompt_len == 16
    assert ContextRun(args, 2048, [1, 8], ["--x"], nested=False).argv == ["--x"]


@pytest.mark.parametrize("raw", ["0", "1.5", "-0.2", "nan", "half"])
def test_a_bad_memory_share_is_refused_naming_the_flag(raw, capsys):
    p = argparse.ArgumentParser()
    common.add_device_args(p)
    with pytest.raises(SystemExit):
        p.parse_args(["--gpu-memory-utilization", raw])
    assert "--gpu-memory-utilization" in capsys.readouterr().err


def test_a_study_refuses_a_prompt_length_below_one(tmp_path):
    with pytest.raises(SystemExit, match="--prompt-lens"):
        study.main(["--geometry", "tiny", "--device", "cpu", "--out", str(tmp_path), "--prompt-lens", "64", "0"])
