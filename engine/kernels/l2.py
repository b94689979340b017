"""L2 prefetch for the Triton kernels: lines a kernel will read pulled into L2 before its PDL wait,
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


def early_lines(num_stages: int, block_k: int, k: int, line: int) -> int:
    """Lines of each weight row a tl.dot pipeline's prologue loads first (its num_stages - 1 tiles of
    block_k, at least one) within a K range of k elements, rounded down to a power of two (tl.arange)."""
    elems = min(k, max(1, num_stages - 1) * block_k)
    return 1 << (max(1, elems // line).bit_length() - 1)
