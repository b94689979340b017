"""What the kernel micro-benchmark measures: the Qwen3-4B projection shapes and row counts, the
config candidates each sweep tries, the paged-attention cases, and the rotated weight / KV copies
the timed ops cycle over."""

from __future__ import annotations

import argparse
import math

import torch

from engine.kernels.tuning import SkinnyConfig

SHAPES = [(6144, 2560), (2560, 4096), (19456, 2560), (2560, 9728), (151936, 2560)]  # (N, K) of Qwen3-4B
SHAPE_NAMES = dict(zip(SHAPES, ("qkv", "o", "gate_up", "down", "lm_head"), strict=True))
LAYERS_4B = 36
MS = [1, 2, 4, 8, 16, 32, 64, 128]
L2_BYTES = 60 << 20
ROTATE_BYTES = 4 * L2_BYTES  # copies per op so the working set dwarfs L2
DEVICE = "cuda"
DTYPE = torch.bfloat16
ATTN_GEOMETRY = dict(hq=32, hkv=8, d=128, page=16)  # Qwen3-4B heads
ATTN_CASES = [(b, c, 1) for b in (1, 8, 64) for c in (256, 2048)] + [(1, 2048, 8), (8, 2048, 8)]  # batch, ctx, span


def parse_attn_cases(text: str) -> list[tuple[int, int, int]]:
    """'B:CTX:SPAN,...' -> [(batch, ctx, span)], each a positive int (argparse type)."""
    out = []
    for item in text.split(","):
        parts = item.strip().split(":")
        if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise argparse.ArgumentTypeError(f"attention case {item!r}: expected BATCH:CONTEXT:SPAN, positive ints")
        out.append(tuple(int(p) for p in parts))
    return out


# The shapes furthest from the copy bandwidth in the last H200 sweep (q|k|v 67 %, o 56 %, down 74 %
# at one row) get the extended candidate set.
EXTENDED_SHAPES = {(6144, 2560), (2560, 4096), (2560, 9728)}
DOWN_SHAPE = (2560, 9728)  # the fused silu_mul_linear sweep
# Products only added to the residual stream (o, down): timed as dispatched, split-K partials left
# for the next add + RMSNorm (split_sum.SplitSum), so a split costs no reduce kernel here.
RESIDUAL_SHAPES = {(2560, 4096), DOWN_SHAPE}
FUSED_MS = [1, 2, 4, 8, 16]
NORM_SHAPES = [(6144, 2560), (19456, 2560)]  # the projections after an add + RMSNorm: q|k|v, gate|up
# (block_m, block_n, block_k, num_warps, num_stages); each is tried at every split count.
# num_stages 2 on the GEMV (1, 8, 512, 4, 2): the next weight tile carried (gemv.py)
EXTENDED_GEMV = [
    (1, 16, 512, 4, 1), (1, 32, 512, 4, 1), (1, 16, 256, 4, 2), (1, 16, 256, 4, 3), (1, 32, 256, 4, 3),
    (1, 16, 256, 2, 1), (1, 8, 512, 4, 1), (1, 8, 512, 4, 2), (1, 8, 256, 4, 2),
]  # fmt: skip
EXTENDED_DOT = [
    (16, 16, 256, 4, 3), (16, 16, 512, 4, 2), (16, 32, 256, 4, 4), (16, 32, 512, 4, 2), (16, 32, 512, 4, 3),
    (16, 64, 256, 4, 3), (16, 64, 256, 8, 3), (16, 32, 128, 4, 3),
]  # fmt: skip


def skinny_candidates(m: int, quick: bool, shape: tuple[int, int] | None = None) -> list[tuple[SkinnyConfig, bool]]:
    """(config, extended) pairs to try at this M: the base set for every shape (its wide dot tiles
    also with tma=1), plus the extended set for EXTENDED_SHAPES at M <= 16 (not in --quick)."""
    splits = [1, 2, 4] if quick else [1, 2, 4, 8]
    extended: list[tuple[int, int, int, int, int]] = []
    if m == 1:
        tiles = [(1, 16, 256, 4, 1), (1, 32, 256, 4, 1), (1, 64, 128, 4, 1), (1, 32, 512, 8, 1), (16, 64, 128, 4, 4)]
        extended = EXTENDED_GEMV
    elif m <= 16:
        tiles = [(16, 32, 128, 4, 4), (16, 64, 128, 4, 4), (16, 64, 64, 4, 5), (16, 32, 256, 4, 3), (16, 128, 64, 4, 4)]
        extended = EXTENDED_DOT
    elif m <= 32:
        tiles = [(32, 64, 64, 4, 4), (32, 64, 128, 4, 4), (32, 128, 64, 4, 4)]
        splits = splits if shape in RESIDUAL_SHAPES else splits[:3]
    else:
        tiles = [(64, 64, 64, 4, 4), (64, 128, 64, 4, 4), (64, 64, 128, 4, 3)]
        if m >= 128:
            tiles.append((128, 128, 64, 8, 3))
        splits = splits if shape in RESIDUAL_SHAPES and m <= 64 else splits[:2]
    if quick:
        tiles, extended = tiles[:3], []
    if shape is not None and shape not in EXTENDED_SHAPES:
        extended = []
    out = [(SkinnyConfig(bm, bn, bk, s, nw, ns), False) for bm, bn, bk, nw, ns in tiles for s in splits]
    # the dot tiles the TMA GEMM serves with the warpgroup MMA (BLOCK_N a multiple of 64), on it too
    out += [(cfg._replace(tma=1), False) for cfg, _ in out if cfg.block_m >= 16 and cfg.block_n >= 64]
    return out + [(SkinnyConfig(bm, bn, bk, s, nw, ns), True) for bm, bn, bk, nw, ns in extended for s in splits]


def wide_fused_tiles(m: int, quick: bool) -> list[SkinnyConfig]:
    """Wider-N tiles the fused SwiGLU + down sweep tries beside the down shape's best linear configs."""
    wide = (
        [(1, 32, 256, 4, 4, 1), (1, 32, 512, 4, 8, 1)]
        if m == 1
        else [(16, 64, 128, 4, 4, 4), (16, 64, 256, 4, 4, 3), (16, 128, 128, 2, 4, 3)]
    )
    return [SkinnyConfig(*c) for c in wide[: 1 if quick else 3]]


def fused_ms(ms: list[int]) -> list[int]:
    """The row counts of this run that the fused sweeps (SwiGLU + down, add + RMSNorm) measure."""
    return [m for m in FUSED_MS if m in ms]


def rotated_weights(n: int, k: int) -> tuple[int, int, list[torch.Tensor]]:
    """(bytes of one [n, k] weight, copies, the copies): at most 16, enough that cycling over them
    keeps L2 from serving the weight."""
    wbytes = n * k * DTYPE.itemsize
    copies = max(1, min(16, math.ceil(ROTATE_BYTES / wbytes)))
    return wbytes, copies, [torch.randn(n, k, device=DEVICE).mul_(0.02).to(DTYPE) for _ in range(copies)]


def paged_case(batch: int, ctx: int, span: int, hq: int, hkv: int, d: int, page: int):
    dtype, seq = DTYPE, ctx + span
    per = -(-seq // page)
    bt = torch.randperm(batch * per, device=DEVICE).to(torch.int32).view(batch, per)
    kc = torch.randn(batch * per, page, hkv, d, device=DEVICE).to(dtype)
    vc = torch.randn_like(kc)
    q = torch.randn(batch * span, hq, d, device=DEVICE).to(dtype)
    seq_lens = torch.full((batch,), seq, dtype=torch.int32, device=DEVICE)
    qsl = torch.arange(0, batch + 1, dtype=torch.int32, device=DEVICE) * span
    return q, kc, vc, bt, seq_lens, qsl
