"""PTX of the decode kernels compiled for sm90 on any host (no GPU), for the kernel PTX tests. Call
these in a child process where TRITON_INTERPRET is off (tests.kernel_helpers.compile_in_child)."""

from __future__ import annotations

import inspect

# The integer arguments of decode attention at an engine launch (q [T, 32, 128], a [blocks, 16, 8,
# 128] cache, a 129-column block table): those divisible by 16 are specialised so by Triton's JIT.
STRIDES = dict(stride_qt=4096, stride_qh=128, stride_ot=4096, stride_oh=128, stride_kb=16384, stride_ko=1024)
STRIDES |= dict(stride_kh=128, stride_vb=16384, stride_vo=1024, stride_vh=128, stride_bt=129)
POINTERS = {"bt_ptr": "*i32", "seq_lens_ptr": "*i32", "qsl_ptr": "*i32", "part_o_ptr": "*fp32", "part_lse_ptr": "*fp32"}


def _compile(kernel, sig: dict, const: dict, attrs: dict, **options):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    src = ASTSource(fn=kernel, signature=sig, constexprs=const, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def compile_attention_ptx(block_n: int, warps: int, stages: int, splits: int, early_lines: int = 2) -> str:
    """PTX of decode attention (bf16, Qwen3-4B heads) at this config; early_lines: 128-byte lines a
    row prefetched before the PDL wait (2 as launched at 128 dims, 0 none)."""
    from engine.kernels import _triton, attention_kernels

    kernel = _triton.bind(attention_kernels.__dict__)["paged_attn_kernel"]
    names = list(inspect.signature(kernel.fn).parameters)
    const = dict(HKV=8, HQ=32, G=4, D=128, PAGE=16, BLOCK_Q=4, BLOCK_M=16, BLOCK_N=block_n, NUM_SPLITS=splits)
    const |= dict(CAUSAL=True, PRECISION="tf32", EARLY_LINES=early_lines, PDL=True)
    pointers = {n: POINTERS.get(n, "*bf16") for n in names if n.endswith("_ptr") or n in ("k_cache", "v_cache")}
    sig = {n: "constexpr" if n in const else pointers.get(n, "fp32" if n == "qk_scale" else "i32") for n in names}
    divisible = {n for n in STRIDES if STRIDES[n] % 16 == 0} | set(pointers)
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n in divisible}
    return _compile(kernel, sig, const, attrs, num_warps=warps, num_stages=stages).asm["ptx"]


def compile_gemv_ptx(cfg, k: int, swiglu: bool, norm: bool, planes: int) -> str:
    """PTX of the early-weights GEMV (gemv.py) at a SkinnyConfig, bf16, K = k, with the integer
    arguments specialised as a launch would (divisible by 16; M, the tiles and eps left alone)."""
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
    return _compile(kernel, sig, const, attrs, num_warps=cfg.num_warps, num_stages=1).asm["ptx"]
