"""One decode-path op at the Qwen3-4B shapes, as the engine dispatches it, launched under the CUDA
profiler's start / stop so that Nsight Compute profiles that one call's kernels (GPU only; the
`ncu` stage of scripts/device.sh runs it per op and row count):

    ncu --profile-from-start off --clock-control none --section SpeedOfLight ... \
        python -m engine.bench.ncu_ops --op attention --rows 64 [--ctx 256]

Ops (kernel_ab_cases.py builds them): `qkv` (add + RMSNorm -> q|k|v), `attention` (QK-norm + RoPE
+ KV store, then the paged attention over --ctx cached rows), `o`, `gate_up` (gate|up then SwiGLU:
the epilogue or the pair, as dispatched), `down` (SwiGLU -> down: the fused kernel at one row, else
silu_and_mul's output into down); o and down with their split-K partials deferred as the layer
asks (at one row: no reduce kernel). The op runs
--warmup times first (compiles, the tuned table), then once between start and stop.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

import torch

from engine.bench import kernel_ab_cases as ab
from engine.bench import kernel_cases as cases
from engine.kernels import fused_linear, linear


def _to_residual(n: int, k: int, m: int, swiglu: bool) -> tuple[int, Callable[[int], object]]:
    """o (or SwiGLU -> down) as the layer calls it: defer=True, so at one row the split-K partials
    are left for the next add + RMSNorm (no reduce kernel) and the GEMV takes its early weights."""
    _, copies, ws = cases.rotated_weights(n, k)
    x = torch.randn(m, 2 * k if swiglu else k, device=cases.DEVICE).to(cases.DTYPE)
    project = fused_linear.silu_mul_linear if swiglu else linear.linear
    return copies, lambda i: project(x, ws[i], defer=True)


# op -> (rows, ctx) -> (copies, fn(copy))
OPS: dict[str, Callable[[int, int], tuple[int, Callable[[int], object]]]] = {
    "qkv": lambda m, ctx: ab.norm_case(6144, 2560, m)[1:3],
    "attention": lambda m, ctx: ab.rope_attention_case(m, ctx)[1:3],
    "o": lambda m, ctx: _to_residual(2560, 4096, m, swiglu=False),
    "gate_up": lambda m, ctx: ab.glu_case(19456, 2560, m)[1:3],
    "down": lambda m, ctx: _to_residual(2560, 9728, m, swiglu=True),
}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine.bench.ncu_ops", description=__doc__.split("\n\n")[0])
    p.add_argument("--op", choices=sorted(OPS), required=True)
    p.add_argument("--rows", type=int, default=1, help="rows (the decode batch)")
    p.add_argument("--ctx", type=int, default=256, help="cached rows a sequence attends to (attention)")
    p.add_argument("--warmup", type=int, default=3)
    args = p.parse_args(argv)
    if min(args.rows, args.ctx) < 1 or args.warmup < 0:
        p.error("need --rows and --ctx >= 1 and --warmup >= 0")
    if not torch.cuda.is_available():
        p.error("needs a CUDA device")
    torch.manual_seed(0)
    copies, fn = OPS[args.op](args.rows, args.ctx)
    for i in range(args.warmup):
        fn(i % min(2, copies))
    torch.cuda.synchronize()
    cudart = torch.cuda.cudart()
    cudart.cudaProfilerStart()
    fn(min(2, copies - 1))  # with three copies or more, one no warm-up read
    torch.cuda.synchronize()
    cudart.cudaProfilerStop()
    print(f"profiled: {args.op} at {args.rows} rows (ctx {args.ctx})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
