"""Registers and programs an SM of the one-row GEMV (engine/kernels/gemv.py) at a device's tuned
configs for the Qwen3-4B projections, compiled for sm90 by Triton and its bundled ptxas on any host
(no GPU): which grids fit in one wave, and how many weight bytes each SM keeps in flight.

    python -m engine.bench.regs_gemv [--device "NVIDIA H200"] [--sms 132]

One row per projection as a decode layer dispatches it at one row: q|k|v and gate|up with the
add + RMSNorm prologue summing the split-K partials of the projection before them (down's, o's),
o and SwiGLU -> down with theirs deferred. Columns: the config, registers a thread, spill bytes,
programs an SM (by registers, allocated 8 a thread at a time, and by threads), the grid's programs
and its waves over --sms SMs, and the weight bytes in flight an SM (the programs resident on it x
the tiles each holds: two with the carried tile, else one).
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
from collections.abc import Sequence

from engine.bench.regs import ctas_by_registers, ptxas_path, ptxas_usage
from engine.bench.report import markdown_table
from engine.kernels import fused_linear, gemm, linear, tuning
from engine.kernels._triton import cdiv
from engine.kernels.tuning import SkinnyConfig, TunedTables

THREADS_PER_SM = 2048
# name, (N, K), prologue, the projection whose split-K partials its x is (NORM prologue only)
PROJECTIONS = [
    ("q|k|v", (6144, 2560), "norm", "down"),
    ("o", (2560, 4096), "deferred", None),
    ("gate|up", (19456, 2560), "norm", "o"),
    ("down", (2560, 9728), "swiglu", None),
]


def one_row_config(prologue: str, shape: tuple[int, int], tables: TunedTables) -> SkinnyConfig | None:
    """The config the dispatch takes at one row for this projection (None: not the GEMV)."""
    n, k = shape
    if prologue == "norm":
        cfg = fused_linear.add_rms_norm_linear_config(1, n, k, tables)
    elif prologue == "swiglu":
        cfg = fused_linear.silu_mul_linear_config(1, n, k, tables)
    else:
        cfg = linear.skinny_config(1, n, k, tables)
    return cfg if cfg is not None and cfg.block_m == 1 else None


def compile_gemv_ptx(cfg: SkinnyConfig, k: int, swiglu: bool, norm: bool, planes: int) -> str:
    """PTX of the early-weights GEMV at this config, bf16, for sm90, with the integer arguments
    specialised as the launch would (divisible by 16; M, the tiles and eps left alone)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from engine.kernels import _triton, gemv

    kernel = _triton.bind(gemv.__dict__)["_gemv_kernel"]
    split = cfg.split_k > 1
    const = dict(BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT=split, EVEN_K=k % cfg.block_k == 0 and not split)
    const |= dict(SWIGLU=swiglu, NORM=norm, CARRY=cfg.num_stages >= 2, PLANES=planes, PDL=True)
    pointers = {"x_ptr": "*fp32" if planes else "*bf16", "p_ptr": "*fp32"}
    sig = {}
    for name in inspect.signature(kernel.fn).parameters:
        if name in const:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = pointers.get(name, "*bf16")
        else:
            sig[name] = "fp32" if name == "eps" else "i32"
    plain = [name for name, kind in sig.items() if kind != "constexpr"]
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(plain) if name not in ("M", "eps")}
    src = ASTSource(fn=kernel, signature=sig, constexprs=const, attrs=attrs)
    options = dict(num_warps=cfg.num_warps, num_stages=1)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]


def occupancy(registers: int, warps: int) -> int:
    """Programs an SM holds by registers (regs.ctas_by_registers) and by threads."""
    return min(ctas_by_registers(registers, warps), THREADS_PER_SM // (32 * warps))


def grid_row(name: str, shape: tuple[int, int], cfg: SkinnyConfig, usage: dict, sms: int) -> dict:
    """One projection's grid against the SMs: programs, waves, weight bytes in flight an SM."""
    n, _ = shape
    per_sm = occupancy(usage["registers"], cfg.num_warps)
    programs = cdiv(n, cfg.block_n) * cfg.split_k
    tiles = 2 if cfg.num_stages >= 2 else 1
    resident = min(per_sm, programs / sms)
    in_flight = resident * tiles * cfg.block_n * cfg.block_k * 2
    config = f"[{cfg.block_n}, {cfg.block_k}, split {cfg.split_k}, {cfg.num_warps} warps, {tiles} tile(s)]"
    row = dict(projection=name, config=config, **usage, programs_an_sm=per_sm, programs=programs)
    return row | dict(waves=programs / (per_sm * sms), kb_in_flight_an_sm=in_flight / 1024)


def rows(tables: TunedTables, sms: int) -> list[dict]:
    configs = {name: one_row_config(prologue, shape, tables) for name, shape, prologue, _ in PROJECTIONS}
    out = []
    for name, shape, prologue, producer in PROJECTIONS:
        cfg = configs[name]
        if cfg is None:
            continue
        source = configs.get(producer) if producer else None
        planes = source.split_k if source is not None and source.split_k > 1 and gemm.DEFER_MAX_ROWS >= 1 else 0
        ptx = compile_gemv_ptx(cfg, shape[1], prologue == "swiglu", prologue == "norm", planes)
        out.append(grid_row(name, shape, cfg, ptxas_usage(ptx), sms))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine.bench.regs_gemv", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="NVIDIA H200", help="the tuned table's device name")
    p.add_argument("--sms", type=int, default=132, help="SMs on that device")
    args = p.parse_args(argv)
    if args.sms < 1:
        raise SystemExit(f"--sms: at least 1, got {args.sms}")
    if not tuning.tuned_path(args.device).is_file():
        raise SystemExit(f"--device: no tuned table for {args.device!r} ({tuning.tuned_path(args.device)})")
    os.environ.pop("TRITON_INTERPRET", None)
    if not ptxas_path().exists():
        raise SystemExit(f"no ptxas at {ptxas_path()} (triton's nvidia backend)")
    found = rows(tuning.load(args.device), args.sms)
    if not found:
        raise SystemExit(f"--device: no one-row GEMV config in the table for {args.device!r}")
    keys = ["projection", "config", "registers", "spill_stores", "spill_loads", "programs_an_sm", "programs"]
    table = [[r[k] for k in keys] + [f"{r['waves']:.2f}", f"{r['kb_in_flight_an_sm']:.0f}"] for r in found]
    for line in table:
        line[0] = line[0].replace("|", "\\|")  # a Markdown cell
    print(markdown_table(keys + ["waves", "KB in flight an SM"], table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
