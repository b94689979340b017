"""The interleaved decode dispatch A/B: arms alternate per repeat with a rotating start, each warmed
up once under its own dispatch, and the paired ratio is taken within a repeat."""

from __future__ import annotations

import csv
from contextlib import contextmanager, nullcontext
from functools import partial

import pytest

from engine.bench import ab_arms, decode_ab, verify_ab
from engine.kernels import mlp


def test_arms_alternate_with_a_rotating_start_under_their_own_dispatch():
    seen = []

    @contextmanager
    def tag(name):
        seen.append(("enter", name))
        yield

    runs = {"before": lambda: tag("before"), "after": lambda: tag("after")}
    calls = []
    rows = decode_ab.interleaved(runs, [1, 4], 3, lambda arm, c: calls.append((arm, c)) or {"tok_s": 1.0})
    assert calls[:2] == [("before", 1), ("after", 1)]  # the warm-ups
    order = [(r["arm"], r["repeat"]) for r in rows if r["concurrency"] == 1]
    assert order == [("before", 0), ("after", 0), ("after", 1), ("before", 1), ("before", 2), ("after", 2)]
    assert [e[1] for e in seen] == [a for a, _ in calls]  # every run inside its arm's context


def test_the_before_arm_runs_the_previous_dispatch():
    inside = []
    rows = decode_ab.interleaved(
        ab_arms.ARMS, [1], 1, lambda arm, c: inside.append((arm, mlp.GLU_MAX_ROWS)) or {"tok_s": 1.0}
    )
    on = mlp.GLU_MAX_ROWS
    assert on > 0 and inside == [("before", 0), ("after", on)] * 2 and len(rows) == 2
    assert on == mlp.GLU_MAX_ROWS


def test_paired_ratio_is_within_a_repeat():
    rows = [
        {"arm": "before", "concurrency": 1, "repeat": 0, "tok_s": 100.0, "step_ms": 3.0, "target_ms": 2.9},
        {"arm": "after", "concurrency": 1, "repeat": 0, "tok_s": 110.0, "step_ms": 2.8, "target_ms": 2.7},
        {"arm": "after", "concurrency": 1, "repeat": 1, "tok_s": 90.0, "step_ms": 3.1, "target_ms": 3.0},
        {"arm": "before", "concurrency": 1, "repeat": 1, "tok_s": 80.0, "step_ms": 3.3, "target_ms": 3.2},
    ]
    (cell,) = decode_ab.summary(sorted(rows, key=lambda r: (r["repeat"], r["arm"] != "before")))
    assert cell["ratio_min"] == 1.1 and cell["ratio_max"] == 1.125
    assert cell["before_tok_s"] == 90.0 and cell["after_step_ms"] == 2.95


def test_runs_end_to_end_on_the_tiny_geometry(tmp_path, capsys):
    argv = ["--out", str(tmp_path), "--geometry", "tiny", "--device", "cpu", "--concurrency", "1", "2"]
    assert decode_ab.main([*argv, "--repeats", "2", "--new-tokens", "4", "--prompt-len", "8", "--stagger", "4"]) == 0
    with (tmp_path / "decode_ab.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * 2 * 2 and {r["arm"] for r in rows} == {"before", "after"}
    assert "after / before (paired)" in (tmp_path / "decode_ab.md").read_text()


def test_bad_values_are_refused_before_any_weights_are_built(tmp_path):
    bad = (["--repeats", "0"], ["--concurrency", "0"], ["--new-tokens", "1"], ["--prompt-len", "0"])
    for flags in (*bad, ["--stagger", "-1"], ["--prompt-len", "8", "--stagger", "8"]):
        with pytest.raises(SystemExit, match="need --repeats"):
            decode_ab.main(["--out", str(tmp_path), "--geometry", "tiny", "--device", "cpu", *flags])


def test_kernel_rows_put_both_arms_side_by_side(monkeypatch):
    """Per c, one row per kernel either arm ran (zero where an arm did not), each profiled under its
    own arm's dispatch, sorted by the larger time; the Markdown totals each arm's column."""
    seen = []

    def fake_profile(engine, prompts, c, new_tokens, top):
        seen.append((engine, c, mlp.GLU_MAX_ROWS))
        kernels = [{"name": "_linear_kernel", "calls_per_step": 2.0, "ms_per_step": 0.010}]
        if engine == "before":
            kernels.append({"name": "_splitk_reduce_kernel", "calls_per_step": 1.0, "ms_per_step": 0.002})
        return {"kernels": kernels}

    monkeypatch.setattr(decode_ab, "profile_arm", fake_profile)
    rows = decode_ab.kernel_rows({"before": "before", "after": "after"}, [[1, 2]] * 8, [8], 4)
    assert seen == [("before", 8, 0), ("after", 8, mlp.GLU_MAX_ROWS)]
    assert [r["kernel"] for r in rows] == ["_linear_kernel", "_splitk_reduce_kernel"]
    assert rows[1]["after_calls"] == 0.0 and rows[1]["before_us"] == 2.0 and rows[0]["after_us"] == 10.0
    md = decode_ab.kernels_markdown(rows)
    assert "### Kernels at c=8" in md and "| 12.0 | 10.0 |" in md


def test_a_bad_table_flag_is_refused_before_any_engine(tmp_path):
    with pytest.raises(SystemExit, match="--after-tables: .*No such file"):
        decode_ab.main(["--out", str(tmp_path), "--device", "cpu", "--after-tables", str(tmp_path / "none.json")])


def test_verify_rows_run_under_both_arms_interleaved_and_pair_by_repeat(tmp_path):
    argv = ["--out", str(tmp_path), "--geometry", "tiny", "--device", "cpu", "--concurrency", "1"]
    argv += ["--repeats", "2", "--new-tokens", "2", "--prompt-len", "4"]
    flags = ["--verify-batches", "1", "2", "--verify-spans", "3", "--verify-context", "8"]
    assert decode_ab.main([*argv, *flags]) == 0
    with (tmp_path / "verify_ab.csv").open() as f:
        rows = list(csv.DictReader(f))
    points = {(r["batch"], r["span"]) for r in rows}
    assert points == {("1", "3"), ("2", "3")}
    assert [r["arm"] for r in rows if (r["batch"], r["span"]) == ("2", "3")] == ["before", "after", "after", "before"]
    assert all(float(r["ms"]) > 0 and int(r["rows"]) == int(r["batch"]) * int(r["span"]) for r in rows)
    assert "### Verify forward, both dispatches" in (tmp_path / "decode_ab.md").read_text()


def test_verify_markdown_pairs_each_repeat():
    rows = [
        {"arm": "before", "repeat": 0, "batch": 4, "span": 8, "ms": 4.0},
        {"arm": "after", "repeat": 0, "batch": 4, "span": 8, "ms": 2.0},
        {"arm": "after", "repeat": 1, "batch": 4, "span": 8, "ms": 5.0},
        {"arm": "before", "repeat": 1, "batch": 4, "span": 8, "ms": 5.5},
    ]
    assert "| 4 | 8 | 32 | 4.750 | 3.500 | 1.550 (1.100 … 2.000) |" in verify_ab.verify_markdown(rows)


def test_bad_verify_values_are_refused_before_any_weights_are_built(tmp_path):
    for flags in (["--verify-batches", "0"], ["--verify-spans", "0"], ["--verify-context", "0"]):
        with pytest.raises(SystemExit, match="need --verify-batches"):
            decode_ab.main(["--out", str(tmp_path), "--geometry", "tiny", "--device", "cpu", *flags])


def test_settings_are_engine_kernels_constants_set_inside_the_arm_only():
    from engine.kernels import attention

    setting = ab_arms.parse_setting("attention.SPLIT_TARGET_PROGRAMS_PER_SM = 4")
    assert setting == (attention, "SPLIT_TARGET_PROGRAMS_PER_SM", 4)
    shipped, glu = attention.SPLIT_TARGET_PROGRAMS_PER_SM, mlp.GLU_MAX_ROWS
    seen = []
    runs = {"before": ab_arms.ARMS["before"], "after": partial(ab_arms.arm_context, nullcontext, [setting])}
    decode_ab.interleaved(
        runs, [1], 1, lambda arm, c: seen.append((arm, attention.SPLIT_TARGET_PROGRAMS_PER_SM)) or {"tok_s": 1.0}
    )
    assert set(seen) == {("before", shipped), ("after", 4)}
    restored = (attention.SPLIT_TARGET_PROGRAMS_PER_SM, mlp.GLU_MAX_ROWS)
    assert restored == (shipped, glu)
    from engine import decode_overlap

    assert ab_arms.parse_setting("decode_overlap.GROW_AHEAD=False") == (decode_overlap, "GROW_AHEAD", False)
    bad_ones = ("attention.SPLIT_TARGET_PROGRAMS_PER_SM", "nosuch.X=1", "attention.NOPE=1", "attention.EARLY_KV=on")
    for bad in (*bad_ones, "decode_overlap.NOPE=1"):
        with pytest.raises(ValueError):
            ab_arms.parse_setting(bad)


def test_a_bad_setting_is_refused_before_any_engine(tmp_path):
    with pytest.raises(SystemExit, match="--before-set: .*has no NOPE"):
        decode_ab.main(["--out", str(tmp_path), "--device", "cpu", "--before-set", "attention.NOPE=1"])


def test_engine_fields_build_each_arms_engine(tmp_path, monkeypatch):
    """--before-engine decode_overlap=False: the before engine steps one by one, the after one launches
    ahead; a field that EngineConfig lacks, or a value that is no literal, is refused."""
    built = []
    real = decode_ab.make_engine
    monkeypatch.setattr(decode_ab, "make_engine", lambda *a, **kw: built.append(kw["options"]) or real(*a, **kw))
    argv = ["--out", str(tmp_path), "--geometry", "tiny", "--device", "cpu", "--concurrency", "2"]
    argv += ["--repeats", "1", "--new-tokens", "4", "--prompt-len", "8", "--before-engine", "decode_overlap=False"]
    assert decode_ab.main(argv) == 0
    assert built == [{"decode_overlap": False}, {}]
    for bad in (["--after-engine", "no_such_field=1"], ["--before-engine", "decode_overlap=nope"]):
        with pytest.raises(SystemExit, match="-engine"):
            decode_ab.main(["--out", str(tmp_path), "--geometry", "tiny", "--device", "cpu", *bad])


def test_known_pair_arms_run_gated_rounds_with_a_drafter(tmp_path, monkeypatch):
    """--known-pair: both engines get the geometry's DFlash drafter and its block headroom; with
    levers max_batch 1 every decode-side round is a gated one-token round, which engine_run times."""
    engines = []
    real = decode_ab.make_engine
    monkeypatch.setattr(decode_ab, "make_engine", lambda *a, **kw: engines.append((a, kw)) or real(*a, **kw))
    argv = ["--out", str(tmp_path), "--geometry", "tiny", "--device", "cpu", "--concurrency", "2", "--repeats", "1"]
    argv += ["--new-tokens", "5", "--prompt-len", "8", "--known-pair"]
    gate = "levers={'max_batch': 1}"
    assert decode_ab.main([*argv, "--before-engine", gate, "decode_overlap=False", "--after-engine", gate]) == 0
    assert all(a[1] is not None and kw["headroom"] > 0 for a, kw in engines)
    with (tmp_path / "decode_ab.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert all(int(r["decode_steps"]) == 4 and float(r["step_ms"]) > 0 for r in rows)  # the gated rounds
