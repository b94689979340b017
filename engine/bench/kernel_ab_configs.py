"""The candidate configs `engine.bench.kernel_ab` times beside each dispatched op (its "[config]" rows):
the data for the tuned table's entries."""

from __future__ import annotations

from engine.kernels._triton import next_pow2
from engine.kernels.tuning import SkinnyConfig

# One-row candidates of the early-weights GEMV (num_stages 2: the next tile carried; gemv.py), run on
# it for o and SwiGLU->down too (which dispatch to the wait-first path), for a later retune.
CANDIDATES = [
    SkinnyConfig(1, 8, 256, 1, 4, 2),
    SkinnyConfig(1, 16, 256, 1, 4, 2),
    SkinnyConfig(1, 16, 512, 1, 4, 2),
    SkinnyConfig(1, 8, 512, 1, 4, 1),
    SkinnyConfig(1, 8, 512, 2, 4, 2),
]
# tl.dot-path configs of the fused kernels at 2-16 rows (the NORM prologue needs split_k 1).
PREFETCH_NORM = [
    SkinnyConfig(16, 32, 256, 1, 4, 4),
    SkinnyConfig(16, 64, 64, 1, 4, 5),
    SkinnyConfig(16, 64, 128, 1, 4, 3),
    SkinnyConfig(16, 32, 128, 1, 4, 4),
    SkinnyConfig(16, 64, 256, 1, 4, 3),
    SkinnyConfig(16, 64, 256, 1, 8, 3),
    SkinnyConfig(16, 128, 128, 1, 8, 3),
    SkinnyConfig(16, 128, 64, 1, 4, 4),
    SkinnyConfig(16, 16, 256, 1, 4, 4),
]
PREFETCH_SWIGLU = [
    SkinnyConfig(16, 32, 128, 4, 4, 4),
    SkinnyConfig(16, 32, 128, 8, 4, 3),
    SkinnyConfig(16, 64, 64, 8, 4, 5),
    SkinnyConfig(16, 32, 256, 4, 4, 3),
    SkinnyConfig(16, 64, 128, 4, 4, 3),
    SkinnyConfig(16, 64, 128, 8, 8, 3),
    SkinnyConfig(16, 16, 256, 8, 4, 3),
    SkinnyConfig(16, 32, 64, 8, 4, 5),
]
# Tilings of gate|up's SwiGLU epilogue at 2-64 rows (split_k 1), beside the dispatched half tile.
GLU_CANDIDATES = [
    SkinnyConfig(16, 32, 64, 1, 4, 4),
    SkinnyConfig(16, 32, 128, 1, 4, 3),
    SkinnyConfig(16, 64, 64, 1, 4, 4),
    SkinnyConfig(64, 32, 64, 1, 4, 3),
    SkinnyConfig(64, 32, 128, 1, 4, 3),
    SkinnyConfig(64, 64, 64, 1, 8, 3),
]
# TMA GEMM tilings at 1-64 rows (BLOCK_N a multiple of 64: the warpgroup MMA's M side), BLOCK_M the
# row bucket's (16 at least); split-K only for plain projections. GLU's BLOCK_N is per half.
TMA_TILES = [  # block_n, block_k, split_k, num_warps, num_stages
    (64, 64, 1, 4, 4),
    (64, 64, 1, 4, 6),
    (64, 128, 1, 4, 4),
    (128, 64, 1, 4, 4),
    (128, 128, 1, 8, 3),
    (64, 64, 2, 4, 5),
    (64, 128, 2, 4, 4),
    (64, 64, 4, 4, 5),
    (64, 128, 4, 4, 4),
    (128, 64, 4, 8, 4),
    (64, 64, 8, 4, 5),
    (64, 128, 8, 4, 4),
    # Three and six splits: o and down (N 2560, 40 tiles of 64) as 120 or 240 programs, one or two whole
    # waves of the H200's 132 SMs, where four splits make 160 (28 SMs with two programs).
    (64, 64, 3, 4, 5),
    (64, 128, 3, 4, 4),
    (64, 64, 3, 4, 6),
    (64, 64, 6, 4, 5),
    # Deeper pipelines at 120 programs (more weight bytes in flight per SM), and 128-row weight tiles
    # on six splits (half the activation re-reads per weight byte).
    (64, 128, 3, 4, 5),
    (64, 64, 3, 4, 8),
    (128, 64, 6, 8, 4),
    (128, 128, 6, 8, 3),
]
# One-row split-K configs of o and SwiGLU->down timed with the projection after them (kernel_ab's `pair:`
# rows): fewer, larger programs leave SM slots for the next kernel's early weight loads; more, smaller
# ones fill the SMs. Whole K (split 1) would leave the next norm no partials to sum.
PAIR_CANDIDATES = [
    SkinnyConfig(1, 8, 512, 2, 4, 2),
    SkinnyConfig(1, 16, 512, 2, 4, 2),
    SkinnyConfig(1, 16, 256, 2, 4, 2),
    SkinnyConfig(1, 16, 256, 4, 4, 2),
    SkinnyConfig(1, 16, 256, 4, 4, 1),
    SkinnyConfig(1, 8, 512, 4, 4, 2),
    SkinnyConfig(1, 8, 256, 4, 4, 2),
    SkinnyConfig(1, 32, 256, 2, 4, 2),
    SkinnyConfig(1, 16, 512, 4, 4, 2),
    SkinnyConfig(1, 16, 256, 8, 4, 2),
]
NORM_CANDIDATES = [
    SkinnyConfig(1, 16, 256, 1, 4, 2),
    SkinnyConfig(1, 32, 128, 1, 4, 2),
    SkinnyConfig(1, 8, 512, 1, 4, 2),
]


def tma_configs(m: int, glu: bool) -> list[SkinnyConfig]:
    """TMA_TILES at m rows (with glu: those without split-K), tma=1."""
    block_m = min(64, max(16, next_pow2(m)))
    tiles = [t for t in TMA_TILES if not (glu and t[2] > 1)]
    return [SkinnyConfig(block_m, *t, tma=1) for t in tiles]
