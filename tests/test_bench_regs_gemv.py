"""The one-row GEMV's register report: the tuned configs compiled for sm90 by Triton and ptxas on a
host without a GPU (in a child process, where TRITON_INTERPRET is off), and its occupancy arithmetic."""

from __future__ import annotations

import pytest

pytest.importorskip("triton", reason="triton is not installed: nothing to compile")

from engine.bench import regs, regs_gemv  # noqa: E402
from engine.kernels import tuning  # noqa: E402
from engine.kernels.tuning import SkinnyConfig  # noqa: E402
from tests.kernel_helpers import run_compiling  # noqa: E402


def test_programs_an_sm_round_registers_to_eight_a_thread_and_stop_at_the_thread_limit():
    assert regs_gemv.occupancy(88, 4) == 5  # 88 -> 88 a thread: 11,264 of 65,536 registers a program
    assert regs_gemv.occupancy(90, 4) == 5 and regs_gemv.occupancy(93, 4) == 5  # 96 a thread
    assert regs_gemv.occupancy(166, 4) == 3 and regs_gemv.occupancy(255, 4) == 2
    assert regs_gemv.occupancy(16, 4) == 16  # 2,048 threads an SM


def test_a_grid_row_counts_its_waves_and_the_bytes_it_keeps_in_flight():
    usage = dict(registers=88, spill_stores=0, spill_loads=0)
    row = regs_gemv.grid_row("gate|up", (19456, 2560), SkinnyConfig(1, 16, 256, 1, 4, 1), usage, 132)
    assert row["programs"] == 1216 and row["programs_an_sm"] == 5
    assert row["waves"] == pytest.approx(1216 / 660) and row["kb_in_flight_an_sm"] == pytest.approx(5 * 8)
    carried = regs_gemv.grid_row("o", (2560, 4096), SkinnyConfig(1, 8, 512, 2, 4, 2), usage, 132)
    assert carried["programs"] == 640 and carried["kb_in_flight_an_sm"] == pytest.approx(640 / 132 * 2 * 8)


def test_the_h200_table_gives_all_four_projections_a_one_row_config():
    t = tuning.load("NVIDIA H200")
    for _, shape, prologue, _ in regs_gemv.PROJECTIONS:
        cfg = regs_gemv.one_row_config(prologue, shape, t)
        assert cfg is not None and cfg.block_m == 1, (shape, cfg)
        assert prologue != "norm" or cfg.split_k == 1  # the prologue needs whole rows


def test_the_report_compiles_each_projection():
    if not regs.ptxas_path().exists():
        pytest.skip("triton ships no ptxas here")
    out = run_compiling("-m", "engine.bench.regs_gemv")
    lines = [line for line in out.strip().splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [line.split(" | ")[0] for line in lines] == ["| q\\|k\\|v", "| o", "| gate\\|up", "| down"]
    for line in lines:
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        registers, stores, loads, per_sm, programs = map(int, cells[2:7])
        assert 32 < registers <= 255 and stores == loads == 0 and 1 <= per_sm <= 16 and programs > 0


def test_a_device_count_below_one_is_refused():
    with pytest.raises(SystemExit, match="--sms"):
        regs_gemv.main(["--sms", "0"])


def test_a_device_without_a_tuned_table_is_refused():
    with pytest.raises(SystemExit, match="--device: no tuned table for 'No Such GPU'"):
        regs_gemv.main(["--device", "No Such GPU"])
