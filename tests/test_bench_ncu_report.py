"""engine.bench.ncu_report on the Nsight Compute text reports of an H200 run (docs/benchmarks)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from engine.bench import ncu_report

RUN = Path(__file__).resolve().parents[1] / "docs/benchmarks/qwen3-4b-geometry-decode-h200/decode-ncu"


def test_kernels_come_out_in_launch_order_with_their_metrics():
    k_rope, k_attn = ncu_report.parse((RUN / "attention-64.txt").read_text())
    assert (k_rope["kernel"], k_rope["grid"], k_rope["block"]) == ("_qk_norm_rope_store_kernel", 320, 128)
    assert (k_attn["kernel"], k_attn["grid"], k_attn["regs"]) == ("paged_attn_kernel", 512, 121)
    assert k_attn["us"] == 26.82 and k_attn["dram_pct"] == 54.53 and k_attn["mem_tb_s"] == 2.62
    assert k_attn["achieved_occ_pct"] == 23.37 and k_attn["theoretical_occ_pct"] == 25
    assert k_attn["issue_per_cycle"] == 0.31 and k_attn["cycles_per_issue"] == 12.08
    assert (
        k_attn["top_stall"]
        == "5.1 cycles waiting for a scoreboard dependency on a L1TEX (local, global, surface, texture) operation"
    )
    (rope,) = [k for k in ncu_report.parse((RUN / "attention-1.txt").read_text()) if k["grid"] == 5]
    assert rope["mem_tb_s"] == 0.005  # Gbyte/s scaled to TB/s


def test_the_directory_becomes_one_table(tmp_path):
    for name in ("attention-64.txt", "gate_up-64.txt"):
        shutil.copy(RUN / name, tmp_path / name)
    (tmp_path / "notes.txt").write_text("not a report")
    assert ncu_report.main([str(tmp_path)]) == 0
    rows = (tmp_path / "ncu.csv").read_text().splitlines()
    assert len(rows) == 1 + 4 and rows[1].startswith("attention,64,_qk_norm_rope_store_kernel")
    assert "| gate_up | 64 | _silu_and_mul_kernel | 640 | 3.62 |" in (tmp_path / "ncu.md").read_text()


def test_an_empty_directory_is_an_error(tmp_path):
    with pytest.raises(SystemExit, match="no Nsight Compute reports"):
        ncu_report.main([str(tmp_path)])
