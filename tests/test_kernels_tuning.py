"""The tuned tables (engine/kernels/tuned/<device>.json): naming, the shipped H200 file, fallbacks,
per-device loading, and the kernel bench's sweep -> tuned table path (setup: tests/kernel_helpers.py)."""

from __future__ import annotations

import argparse
import csv
import json
import warnings
from pathlib import Path

import pytest
import torch

from engine.kernels import fused_linear, linear, tuning
from engine.kernels.tuning import SkinnyConfig, TunedTables
from tests.kernel_helpers import (
    CUDA,
    DEV,
    TOL,
    fused_ref,
    gpu,
    norm_linear_ref,
    poison_empty,  # noqa: F401 (autouse: every torch.empty is poisoned)
    randn,
    rel_err,
)


def test_device_slug():
    assert tuning.device_slug("NVIDIA H200") == "nvidia-h200"
    assert tuning.device_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert tuning.device_slug("  AMD Instinct MI300X (gfx942) ") == "amd-instinct-mi300x-gfx942"
    assert tuning.tuned_path("NVIDIA H200").name == "nvidia-h200.json"


def test_tuned_h200_file():
    """The shipped H200 table parses without dropping anything, covers the Qwen3-4B projections,
    and every entry is runnable (values change with each --write-tuned sweep; not pinned here)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a dropped entry would warn
        t = tuning.load("NVIDIA H200")
    assert t.source == str(tuning.TUNED_DIR / "nvidia-h200.json") and t.device == "nvidia-h200"
    assert t.m_max >= 1 and t.linear is not tuning.DEFAULT.linear
    assert {(6144, 2560), (2560, 4096), (19456, 2560), (2560, 9728), (151936, 2560)} <= set(t.linear)
    assert any(1 in per_m for per_m in t.linear.values())  # the decode row count is tuned somewhere
    for table in (t.linear, t.silu_mul_linear, t.add_rms_norm_linear):
        for per_m in table.values():
            for bucket, cfg in per_m.items():
                assert tuning.check_config(cfg) is None and (cfg.block_m != 1 or bucket == 1)
    # The writer's text round-trips.
    again = tuning.parse(json.loads(tuning.dumps(t, "NVIDIA H200")))
    assert (again.linear, again.silu_mul_linear, again.add_rms_norm_linear) == (
        t.linear,
        t.silu_mul_linear,
        t.add_rms_norm_linear,
    )
    assert (again.m_max, again.fused_m_max, again.norm_m_max) == (t.m_max, t.fused_m_max, t.norm_m_max)


def test_tuned_package_data():
    tomllib = pytest.importorskip("tomllib")  # python >= 3.11
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert "tuned/*.json" in pyproject["tool"]["setuptools"]["package-data"]["engine.kernels"]


def test_tuned_fallback(tmp_path):
    assert tuning.load(None) is tuning.DEFAULT
    assert tuning.load("NVIDIA Future GPU", tmp_path) is tuning.DEFAULT  # no file: default heuristic
    path = tuning.tuned_path("Broken GPU", tmp_path)
    for text in (
        "{not json",
        json.dumps({"format": 99}),
        json.dumps([1, 2]),
        json.dumps({"format": 1, "linear": {"m_max": "16"}}),
        json.dumps({"format": 1, "linear": []}),
        json.dumps({"format": 1, "add_rms_norm_linear": {"m_max": -1}}),
    ):
        path.write_text(text)
        with pytest.warns(UserWarning, match="ignoring the tuned table"):
            assert tuning.load("Broken GPU", tmp_path) is tuning.DEFAULT
    # Bad entries are dropped (that bucket then falls back to cuBLAS), good ones kept.
    good = [16, 32, 128, 4, 4, 4]
    data = {
        "format": 1,
        "device": "Partly GPU",
        "linear": {
            "m_max": 8,
            "configs": {
                "64x96": {
                    "1": [1, 16, 256, 1, 4, 1],
                    "2": [1, 16, 256, 1, 4, 1],
                    "4": good,
                    "3": good,
                    "8": [16, 24, 64, 1, 4, 3],
                    "16": [16, 32, 64],
                    "32": [16, 32, 64, 1, 3, 3],
                    "64": "oops",
                    "128": [16, 64, 64, 1, 4, 3, 2],  # tma is 0 or 1
                    "256": [64, 64, 64, 1, 4, 3, 1],
                    "512": [16, 64, 64, 1, 4, 3, 0, 1],  # an eighth field
                },
                "64by96": {"1": good},
                "32x96": {"1": [1, 16, 256, 1, 4, 1, 1]},  # the GEMV has no TMA path
            },
        },
        "silu_mul_linear": {"configs": {"10x20": {"4": good, "8": [16, 32, 128, 0, 4, 4]}}},
    }
    tuning.tuned_path("Partly GPU", tmp_path).write_text(json.dumps(data))
    with pytest.warns(UserWarning, match="dropped"):
        t = tuning.load("Partly GPU", tmp_path)
    assert t.device == "partly-gpu" and t.m_max == 8 and t.fused_m_max == tuning.DEFAULT_FUSED_M_MAX
    tma = SkinnyConfig(64, 64, 64, 1, 4, 3, tma=1)
    assert t.linear == {
        (64, 96): {1: SkinnyConfig(1, 16, 256, 1, 4, 1), 4: SkinnyConfig(*good), 256: tma},
        (32, 96): {},
    }
    assert SkinnyConfig(*good).tma == 0  # six fields: tma 0
    assert t.silu_mul_linear == {(10, 20): {4: SkinnyConfig(*good)}}
    assert t.add_rms_norm_linear == {} and t.norm_m_max == tuning.DEFAULT_NORM_M_MAX  # a missing section: empty


def test_a_tma_config_keeps_its_flag_through_the_file_and_others_stay_six_fields():
    t = tuning.TunedTables(
        "x", linear={(64, 96): {16: SkinnyConfig(16, 64, 64, 1, 4, 4, 1), 32: SkinnyConfig(32, 64, 64, 2, 4, 4)}}
    )
    text = tuning.dumps(t, "X GPU")
    assert '"16": [16, 64, 64, 1, 4, 4, 1], "32": [32, 64, 64, 2, 4, 4]' in text
    assert tuning.parse(json.loads(text)).linear == t.linear
    assert json.loads(text)["config_fields"][-1] == "tma"


def test_tables_for_device(monkeypatch):
    """Loaded once per device at its first use, by the slug of the CUDA device name (injected here)."""
    names = []

    def fake_name(device=None):
        names.append(device)
        return "NVIDIA H200"

    monkeypatch.setattr(tuning, "_by_device", {})
    monkeypatch.setattr(torch.cuda, "get_device_name", fake_name)
    h200 = tuning.tables_for(torch.device("cuda", 0))
    assert h200.device == "nvidia-h200" and (2560, 9728) in h200.linear
    assert tuning.tables_for(torch.device("cuda", 0)) is h200 and len(names) == 1
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Unknown Accelerator 9000")
    assert tuning.tables_for(torch.device("cuda", 1)) is tuning.DEFAULT
    assert tuning.tables_for(torch.device("cpu")) is tuning.DEFAULT  # the interpreter: never tuned
    tuning.reset()
    assert tuning._by_device == {}


# --- GPU only -----------------------------------------------------------------------------------


@gpu
def test_gpu_tuned_table():
    """This device's tuned file (if there is one) is what the kernels use, and every config in it
    computes the right thing at its own M bucket and weight shape (bf16)."""
    torch.manual_seed(22)
    device = torch.device(DEV, torch.cuda.current_device())
    path = tuning.tuned_path(torch.cuda.get_device_name(device))
    t = tuning.tables_for(device)
    assert t.source == (str(path) if path.is_file() else None), (t.source, path)
    bf = torch.bfloat16
    for op, table in (("linear", t.linear), ("silu_mul", t.silu_mul_linear), ("norm", t.add_rms_norm_linear)):
        for (n, k), per_m in table.items():
            w = randn(n, k, dtype=bf, scale=0.05)
            for bucket, cfg in per_m.items():
                for m in sorted({bucket // 2 + 1, bucket}) if cfg.block_m != 1 else [1]:
                    if op == "silu_mul":
                        x = randn(m, 2 * k, dtype=bf, scale=2.0)
                        out, ref = fused_linear.silu_mul_linear_with_config(x, w, cfg), fused_ref(x, w)
                    elif op == "norm":
                        x, r, nw = randn(m, k, dtype=bf), randn(m, k, dtype=bf), randn(k, dtype=bf)
                        (out, summed), (ref, ref_sum) = (
                            fused_linear.add_rms_norm_linear_with_config(x, r, nw, 1e-6, w, cfg),
                            norm_linear_ref(x, r, nw, 1e-6, w),
                        )
                        assert torch.equal(summed, ref_sum), (op, n, k, m, cfg)
                    else:
                        x = randn(m, k, dtype=bf)
                        out, ref = linear.linear_with_config(x, w, cfg), linear.linear_ref(x.float(), w.float())
                    assert rel_err(out, ref) < TOL[bf], (op, n, k, m, cfg)
            del w


# --- the kernel bench's sweep -> tuned table path (CPU dry run) ---------------------------------


def dry_run_device(monkeypatch, cases, bench) -> None:
    """The kernel bench on the CPU as if on a GPU: fp32 cases, one weight copy, a fixed copy bandwidth."""
    monkeypatch.setattr(cases, "DEVICE", DEV)
    monkeypatch.setattr(cases, "DTYPE", torch.float32)
    monkeypatch.setattr(cases, "ROTATE_BYTES", 1)
    monkeypatch.setattr(bench, "copy_bandwidth", lambda device, nbytes: 4.2e12)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Dry Run GPU")


@pytest.mark.skipif(CUDA, reason="a CPU dry run of the bench plumbing; on a GPU run the bench itself")
def test_bench_write_tuned_dry_run(monkeypatch, tmp_path):
    """engine.bench.kernels end to end on tiny shapes under the interpreter with a fake timer: the
    sweep, the fused sweep, the report and --write-tuned (merge over the existing file)."""
    from engine.bench import kernel_cases as cases
    from engine.bench import kernels as bench

    qkv, down, head = (64, 32), (32, 96), (200, 32)
    monkeypatch.setattr(cases, "SHAPES", [qkv, down, head])
    monkeypatch.setattr(cases, "SHAPE_NAMES", {qkv: "qkv", down: "down", head: "lm_head"})
    monkeypatch.setattr(cases, "EXTENDED_SHAPES", {down})
    monkeypatch.setattr(cases, "DOWN_SHAPE", down)
    monkeypatch.setattr(cases, "NORM_SHAPES", [qkv])
    dry_run_device(monkeypatch, cases, bench)
    monkeypatch.setattr(tuning, "TUNED_DIR", tmp_path / "pkg")
    monkeypatch.setattr(tuning, "_by_device", {})

    def fake_timer(fn, variants, est_us):  # runs the op; the time favours the fused GEMV and split 2
        fn(0)
        cfg = next((c for c in getattr(fn, "__defaults__", None) or () if isinstance(c, SkinnyConfig)), None)
        if cfg is None:
            return 10.0
        fused = {"silu_mul_linear_with_config", "add_rms_norm_linear_with_config"} & set(fn.__code__.co_names)
        gemv = cfg.block_m == 1
        return 9.0 - (cfg.split_k == 2) - 0.5 * gemv - 1.5 * bool(fused and gemv) + 0.01 * cfg.block_n

    monkeypatch.setattr(bench, "Timer", lambda kind: fake_timer)
    old = TunedTables(
        "dry-run-gpu",
        m_max=8,
        linear={head: {1: SkinnyConfig(1, 16, 32, 1, 4, 1)}, (7, 7): {1: SkinnyConfig(1, 16, 32, 1, 4, 1)}},
    )
    (tmp_path / "pkg").mkdir()
    tuning.tuned_path("Dry Run GPU").write_text(tuning.dumps(old, "Dry Run GPU"))
    out = tmp_path / "out"
    rc = bench.main(["--out", str(out), "--ms", "1,2,32", "--skip", "invariant,attention", "--write-tuned"])
    assert rc == 0
    report = (out / "report.md").read_text()
    assert "silu_mul_linear" in report and "add_rms_norm_linear" in report and "Tuned table written" in report
    written = (out / "tuned" / "dry-run-gpu.json").read_text()
    assert written == tuning.tuned_path("Dry Run GPU").read_text()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = tuning.load("Dry Run GPU")
    # Triton "wins" everywhere at 9-ish us against cuBLAS's 10: the best candidate per bucket.
    assert t.linear[down][1] == SkinnyConfig(1, 8, 512, 2, 4, 1)  # an extended GEMV point, split 2
    assert t.linear[qkv][1].block_m == 1 and t.linear[qkv][1].split_k == 2
    assert set(t.linear[qkv]) == {1, 2, 32} and t.linear[qkv][32].block_m == 32
    assert t.linear[(7, 7)] == old.linear[(7, 7)]  # not measured: kept
    assert t.m_max == 8  # a partial --ms keeps the old m_max
    assert set(t.silu_mul_linear[down]) == {1}  # the fused GEMV beats the unfused pair at M = 1 only
    assert t.silu_mul_linear[down][1].block_m == 1
    assert set(t.add_rms_norm_linear[qkv]) == {1}  # the prologue at the best linear tiling, without split-K
    assert t.add_rms_norm_linear[qkv][1] == t.linear[qkv][1]._replace(split_k=1)
    import csv

    rows = list(csv.DictReader((out / "silu_mul_linear.csv").open()))
    assert {r["M"] for r in rows} == {"1", "2"} and {"fused", "silu_and_mul+cublas"} <= {r["impl"] for r in rows}


def test_attention_cases_parse_and_refuse():
    from engine.bench.kernel_cases import parse_attn_cases

    assert parse_attn_cases("16:8192:1, 4:32768:16") == [(16, 8192, 1), (4, 32768, 16)]
    for bad in ("16:8192", "16:0:1", "a:1:1", "16:8192:1:2", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="BATCH:CONTEXT:SPAN"):
            parse_attn_cases(bad)


@pytest.mark.skipif(CUDA, reason="a CPU dry run of the bench plumbing; on a GPU run the bench itself")
def test_bench_attention_cases_dry_run(monkeypatch, tmp_path):
    """The attention section over --attn-cases: every split variant runs and agrees with the reference."""
    from engine.bench import kernel_cases as cases
    from engine.bench import kernels as bench

    monkeypatch.setattr(cases, "ATTN_GEOMETRY", dict(hq=4, hkv=2, d=16, page=4))
    dry_run_device(monkeypatch, cases, bench)
    monkeypatch.setattr(bench, "Timer", lambda kind: lambda fn, variants, est_us: (fn(0), 10.0)[1])
    out = tmp_path / "out"
    rc = bench.main(["--out", str(out), "--skip", "linear,fused,norm,invariant", "--attn-cases", "2:40:1,1:24:3"])
    assert rc == 0
    rows = list(csv.DictReader((out / "attention.csv").open()))
    assert {(r["ctx"], r["variant"]) for r in rows} >= {("40", "splits=8"), ("24", "splits=2"), ("40", "auto")}
    assert max(float(r["rel_err"]) for r in rows) < 1e-4
