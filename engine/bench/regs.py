"""Registers and spills of the paged-attention kernel per launch config, compiled for sm90 by Triton
and its bundled ptxas, on any host (no GPU): what a config costs in occupancy before it is timed.

    python -m engine.bench.regs [--configs 64:4:2 64:8:2 32:4:2] [--splits 1 8]

A config is BLOCK_N:num_warps:num_stages at the Qwen3-4B heads (32 q, 8 kv, 128 dims), decode
(one query per sequence). Prints one Markdown row per config and split count: registers a thread,
spill stores and loads (bytes), shared memory, the `cp.async` copies in its PTX (K/V tiles staged
through shared memory) and the CTAs an SM holds by registers and by shared memory. The integer
arguments carry the divisibility Triton's JIT gives them at a real launch (a value divisible by 16
is specialised so), from their values at that launch: without it the K/V loads are not vectorised
and the report is of another kernel (255 registers and spills at 64:4:2, against 121 as launched).
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from engine.bench.report import markdown_table
from engine.kernels._triton import cdiv

REGS_PER_SM = 65536
SHARED_PER_SM = 232448  # sm90: 227 KB a CTA can use of the SM's 228 KB
POINTERS = {"bt_ptr": "*i32", "seq_lens_ptr": "*i32", "qsl_ptr": "*i32", "part_o_ptr": "*fp32", "part_lse_ptr": "*fp32"}
# The integer arguments at a decode launch of the engine: q the rotated [T, 32, 128] rows, a [blocks,
# 16, 8, 128] cache, a block table of 129 columns (2,064 tokens: not a multiple of 16 in general, so
# not specialised).
STRIDES = dict(stride_qt=4096, stride_qh=128, stride_ot=4096, stride_oh=128, stride_kb=16384, stride_ko=1024)
STRIDES |= dict(stride_kh=128, stride_vb=16384, stride_vo=1024, stride_vh=128, stride_bt=129)


def jit_divisible(name: str) -> bool:
    """Whether Triton's JIT would specialise this argument as divisible by 16 at the engine's launch."""
    return name in STRIDES and STRIDES[name] % 16 == 0


def ptxas_path() -> Path:
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


def compile_ptx(
    block_n: int, warps: int, stages: int, splits: int, early_lines: int = 2, early_bounds: bool = True
) -> tuple[str, int]:
    """(PTX, shared bytes) of decode attention at this config, bf16, for sm90 (early_lines: the
    prefetch before the PDL wait, 2 lines a row as launched at 128 dims, 0 off; early_bounds: the
    bounds read once, before the wait)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from engine.kernels import _triton, attention_kernels

    kernel = _triton.bind(attention_kernels.__dict__)["paged_attn_kernel"]
    names = list(inspect.signature(kernel.fn).parameters)
    const = dict(HKV=8, HQ=32, G=4, D=128, PAGE=16, BLOCK_Q=4, BLOCK_M=16, BLOCK_N=block_n, NUM_SPLITS=splits)
    const |= dict(CAUSAL=True, PRECISION="tf32", EARLY_LINES=early_lines, EARLY_BOUNDS=early_bounds, PDL=True)
    pointers = {n: POINTERS.get(n, "*bf16") for n in names if n.endswith("_ptr") or n in ("k_cache", "v_cache")}
    sig = {n: "constexpr" if n in const else pointers.get(n, "fp32" if n == "qk_scale" else "i32") for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n in pointers or jit_divisible(n)}
    src = ASTSource(fn=kernel, signature=sig, constexprs=const, attrs=attrs)
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages))
    return compiled.asm["ptx"], compiled.metadata.shared


def ptxas_usage(ptx: str) -> dict[str, int]:
    """registers, spill stores and loads (bytes) of one PTX kernel by `ptxas -v`."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        out = subprocess.run(
            [str(ptxas_path()), "-arch=sm_90a", "-v", str(src), "-o", str(Path(tmp) / "k.cubin")],
            capture_output=True,
            text=True,
            check=True,
        ).stderr
    regs = int(re.search(r"Used (\d+) registers", out).group(1))
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", out)
    return {"registers": regs, "spill_stores": int(spill.group(1)), "spill_loads": int(spill.group(2))}


def ctas_by_registers(registers: int, warps: int) -> int:
    """CTAs an SM holds by registers: a thread's are allocated 8 at a time."""
    return REGS_PER_SM // (cdiv(registers, 8) * 8 * 32 * warps)


def row(block_n: int, warps: int, stages: int, splits: int) -> dict:
    ptx, shared = compile_ptx(block_n, warps, stages, splits)
    usage = ptxas_usage(ptx)
    by_regs = ctas_by_registers(usage["registers"], warps)
    by_shared = SHARED_PER_SM // max(shared, 1)
    config = dict(block_n=block_n, warps=warps, stages=stages, splits=splits, shared=shared)
    return config | usage | dict(cp_async=ptx.count("cp.async.cg"), ctas_by_regs=by_regs, ctas_by_shared=by_shared)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine.bench.regs", description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", nargs="+", default=["64:4:2", "64:8:2", "32:4:2"], metavar="BLOCK_N:WARPS:STAGES")
    p.add_argument("--splits", type=int, nargs="+", default=[1, 8])
    args = p.parse_args(argv)
    try:
        configs = [tuple(int(v) for v in c.split(":")) for c in args.configs]
    except ValueError:
        raise SystemExit(f"--configs: expected BLOCK_N:WARPS:STAGES integers, got {args.configs}") from None
    if any(len(c) != 3 for c in configs):
        raise SystemExit(f"--configs: expected BLOCK_N:WARPS:STAGES, got {args.configs}")
    pow2 = lambda v: v >= 1 and v & (v - 1) == 0  # noqa: E731
    if not all(pow2(n) and n >= 16 and pow2(w) and st >= 1 for n, w, st in configs):
        raise SystemExit(
            f"--configs: BLOCK_N a power of two >= 16, WARPS a power of two, STAGES >= 1; got {args.configs}"
        )
    if not all(pow2(s) for s in args.splits):
        raise SystemExit(f"--splits: powers of two >= 1, got {args.splits}")
    os.environ.pop("TRITON_INTERPRET", None)
    if not ptxas_path().exists():
        raise SystemExit(f"no ptxas at {ptxas_path()} (triton's nvidia backend)")
    rows = [row(*c, s) for c in configs for s in args.splits]
    keys = [
        "block_n",
        "warps",
        "stages",
        "splits",
        "registers",
        "spill_stores",
        "spill_loads",
        "shared",
        "cp_async",
        "ctas_by_regs",
        "ctas_by_shared",
    ]
    print(markdown_table(keys, [[r[k] for k in keys] for r in rows]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
