"""L2 prefetch for the Triton kernels: lines a kernel will read, pulled into L2 before its PDL wait,
for data the kernel before it does not write (weights; KV rows cached by earlier launches)."""

from __future__ import annotations

from engine.kernels._triton import jit

tl = None  # triton.language, bound by _triton.bind at the first launch

LINE_BYTES = 128


@jit
def prefetch_l2(ptrs):
    """Pull the lines at ptrs into L2 without waiting for them (nothing comes back)."""
    tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1
    )
