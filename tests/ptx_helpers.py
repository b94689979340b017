"""PTX of the decode kernels compiled for sm90 on any host (no GPU), for the kernel PTX tests. Call
these in a child process where TRITON_INTERPRET is off (tests.kernel_helpers.compile_in_child)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import ModuleType

# The integer arguments of decode attention at an engine launch (q [T, 32, 128], a [blocks, 16, 8,
# 128] cache, a 129-column block table): those divisible by 16 are specialised so by Triton's JIT.
STRIDES = dict(stride_qt=4096, stride_qh=128, stride_ot=4096, stride_oh=128, stride_kb=16384, stride_ko=1024)
STRIDES |= dict(stride_kh=128, stride_vb=16384, stride_vo=1024, stride_vh=128, stride_bt=129)
POINTERS = {"bt_ptr": "*i32", "seq_lens_ptr": "*i32", "qsl_ptr": "*i32", "part_o_ptr": "*fp32", "part_lse_ptr": "*fp32"}


def compile_kernel(
    module: ModuleType,
    name: str,
    types: dict,
    const: dict,
    divisible: Callable[[str], bool] = lambda n: False,
    **options,
) -> str:
    """PTX of module's kernel `name` for sm90: `const` its constexprs, `types` the type of any other
    parameter (default: *bf16 for a pointer, i32 else), divisible(name) marks one divisible by 16."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from engine.kernels import _triton

    kernel = _triton.bind(module.__dict__)[name]
    names = list(inspect.signature(kernel.fn).parameters)
    default = lambda n: "*bf16" if n.endswith("_ptr") else "i32"  # noqa: E731
    sig = {n: "constexpr" if n in const else types.get(n, default(n)) for n in names}
    plain = [n for n in names if n not in const]
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(plain) if divisible(n)}
    src = ASTSource(fn=kernel, signature=sig, constexprs=const, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]


def loads_around_wait(ptx: str) -> list[int]:
    """[global loads before the first griddepcontrol.wait, global loads after it]."""
    lines = ptx.splitlines()
    wait = next(i for i, line in enumerate(lines) if "griddepcontrol.wait" in line)
    loads = [i for i, line in enumerate(lines) if "ld.global" in line]
    return [sum(i < wait for i in loads), sum(i > wait for i in loads)]


def compile_attention_ptx(block_n: int, warps: int, stages: int, splits: int, early_lines: int = 2) -> str:
    """PTX of decode attention (bf16, Qwen3-4B heads) at this config; early_lines: 128-byte lines a
    row prefetched before the PDL wait (2 as launched at 128 dims, 0 none)."""
    from engine.kernels import attention_kernels

    const = dict(HKV=8, HQ=32, G=4, D=128, PAGE=16, BLOCK_Q=4, BLOCK_M=16, BLOCK_N=block_n, NUM_SPLITS=splits)
    const |= dict(MIN_SPLITS=splits, SPLIT_KEYS=512)
    const |= dict(CAUSAL=True, PRECISION="tf32", EARLY_LINES=early_lines, PDL=True)
    divisible = lambda n: n in POINTERS or n.endswith(("_ptr", "_cache")) or STRIDES.get(n, 1) % 16 == 0  # noqa: E731
    types = {**POINTERS, "qk_scale": "fp32", "k_cache": "*bf16", "v_cache": "*bf16"}
    options = dict(num_warps=warps, num_stages=stages)
    return compile_kernel(attention_kernels, "paged_attn_kernel", types, const, divisible, **options)


def compile_gemv_ptx(cfg, k: int, swiglu: bool, norm: bool, planes: int) -> str:
    """PTX of the early-weights GEMV (gemv.py) at a SkinnyConfig, bf16, K = k, with the integer
    arguments specialised as a launch would (divisible by 16; M, the tiles and eps left alone)."""
    from engine.kernels import gemv

    split = cfg.split_k > 1
    const = dict(BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT=split, EVEN_K=k % cfg.block_k == 0 and not split)
    const |= dict(SWIGLU=swiglu, NORM=norm, CARRY=cfg.num_stages >= 2, PLANES=planes, PDL=True)
    types = {"x_ptr": "*fp32" if planes else "*bf16", "p_ptr": "*fp32", "eps": "fp32"}
    divisible = lambda n: n not in ("M", "eps")  # noqa: E731
    return compile_kernel(gemv, "_gemv_kernel", types, const, divisible, num_warps=cfg.num_warps, num_stages=1)
