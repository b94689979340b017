"""The register report: decode attention compiled for sm90 by Triton and ptxas on a host without a
GPU (in a child process, where TRITON_INTERPRET is off), and its argument checks."""

from __future__ import annotations

import pytest

pytest.importorskip("triton", reason="triton is not installed: nothing to compile")

from engine.bench import regs  # noqa: E402
from tests.kernel_helpers import run_compiling  # noqa: E402


def test_a_config_reports_its_registers_and_spills():
    if not regs.ptxas_path().exists():
        pytest.skip("triton ships no ptxas here")
    out = run_compiling("-m", "engine.bench.regs", "--configs", "32:4:2", "--splits", "1")
    cells = [c.strip() for c in out.strip().splitlines()[-1].strip("|").split("|")]
    block_n, warps, stages, splits, registers, stores, loads, shared, copies, by_regs, by_shared = map(int, cells)
    assert (block_n, warps, stages, splits) == (32, 4, 2, 1)
    assert 32 < registers <= 255 and stores >= 0 and loads >= 0 and shared > 0
    assert by_regs == regs.REGS_PER_SM // (-(-registers // 8) * 8 * 32 * warps)  # allocated 8 a thread at a time
    assert by_shared == regs.SHARED_PER_SM // shared
    # As launched (strides divisible by 16), the K/V tiles stream through shared memory by cp.async;
    # compiled without that specialisation they were scalar loads into registers (222 registers here).
    assert copies > 0 and registers < 128


def test_the_strides_carry_the_jit_specialisation():
    assert regs.jit_divisible("stride_kb") and regs.jit_divisible("stride_qt")
    assert not regs.jit_divisible("stride_bt") and not regs.jit_divisible("qk_scale")


@pytest.mark.parametrize("configs", [["64:4"], ["a:b:c"], ["48:4:2"], ["8:4:2"], ["64:3:2"], ["64:4:0"]])
def test_a_malformed_config_is_refused(configs):
    with pytest.raises(SystemExit, match="--configs"):
        regs.main(["--configs", *configs])


@pytest.mark.parametrize("splits", [["0"], ["3"]])
def test_a_split_count_not_a_power_of_two_is_refused(splits):
    with pytest.raises(SystemExit, match="--splits"):
        regs.main(["--splits", *splits])
