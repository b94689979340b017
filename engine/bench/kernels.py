"""GPU micro-benchmark of the Triton kernels (H200-sized; run on a CUDA host).

    python -m engine.bench.kernels --out DIR [--timer graph|do_bench] [--quick] [--write-tuned]

1. Skinny-M linear: the Qwen3-4B projection shapes at M = 1..128 over a config sweep, against
   F.linear (cuBLAS). Prints GB/s (weight bytes / time) and the fraction of the copy bandwidth, the
   best config per (shape, M), the crossover M where cuBLAS wins. q|k|v, o and down (the shapes
   furthest from the copy bandwidth) get an extended sweep (more BLOCK_N/BLOCK_K/split-K/stages/warps
   points), cut short once `--budget-s` is mostly spent.
2. Fused SwiGLU + down (`silu_mul_linear`) at M = 1..16: the best linear configs of the down shape
   and a few wider-N tiles, against silu_and_mul + the best of cuBLAS / the skinny kernel.
3. Residual add + RMSNorm in the projection's prologue (`add_rms_norm_linear`) for q|k|v and
   gate|up at M = 1..16: the shape's best linear configs against add_rms_norm + the best of cuBLAS
   / the skinny kernel.
4. The batch-invariant GEMM (fixed tiles for every M) at a few tilings.
5. Paged attention: decode at batch 1/8/64 x context 256/2048 (auto split vs forced splits vs the
   batch-invariant config) and verify spans of 8.
CSVs land in DIR (linear.csv, silu_mul_linear.csv, add_rms_norm_linear.csv, linear_invariant.csv,
attention.csv) with the printed Markdown (report.md) and the tuned table from this run
(DIR/tuned/<device>.json, always).
`--write-tuned` also installs that table as engine/kernels/tuned/<device>.json, where the kernels read
it (engine/kernels/tuning.py): merged over the existing file, every measured (shape, M bucket) set
to its fastest config that passed the correctness check and beat cuBLAS (or the unfused pair), or
removed (cuBLAS / unfused serves it). The table is written after section 3, before the others run.

Timing: every op is replayed from a CUDA graph of back-to-back calls (as the engine runs decode),
rotating over enough weight / KV copies that L2 (~60 MB) never serves them; the reported time is
the median over replays. `--timer do_bench` uses triton.testing.do_bench (median) instead; it clears
L2 with a 256 MB memset before every call, whose dirty lines are written back during the timed
kernel, which understates bandwidth for weights of a few tens of MB.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.kernels import activation, attention, fused_linear, linear, norm, tuning
from engine.kernels.tuning import SkinnyConfig, TunedTables

SHAPES = [(6144, 2560), (2560, 4096), (19456, 2560), (2560, 9728), (151936, 2560)]  # (N, K) of Qwen3-4B
SHAPE_NAMES = {
    (6144, 2560): "qkv",
    (2560, 4096): "o",
    (19456, 2560): "gate_up",
    (2560, 9728): "down",
    (151936, 2560): "lm_head",
}
LAYERS_4B = 36
MS = [1, 2, 4, 8, 16, 32, 64, 128]
L2_BYTES = 60 << 20
ROTATE_BYTES = 4 * L2_BYTES  # copies per op so the working set dwarfs L2
DEVICE = "cuda"
DTYPE = torch.bfloat16
ATTN_GEOMETRY = dict(hq=32, hkv=8, d=128, page=16)  # Qwen3-4B heads
ATTN_CASES = [(b, c, 1) for b in (1, 8, 64) for c in (256, 2048)] + [(1, 2048, 8), (8, 2048, 8)]  # batch, ctx, span


# The shapes furthest from the copy bandwidth in the last H200 sweep (q|k|v 67 %, o 56 %, down 74 %
# at one row) get the extended candidate set.
EXTENDED_SHAPES = {(6144, 2560), (2560, 4096), (2560, 9728)}
DOWN_SHAPE = (2560, 9728)  # the fused silu_mul_linear sweep
FUSED_MS = [1, 2, 4, 8, 16]
NORM_SHAPES = [(6144, 2560), (19456, 2560)]  # the projections after an add + RMSNorm: q|k|v, gate|up
# (block_m, block_n, block_k, num_warps, num_stages); each is tried at every split count.
EXTENDED_GEMV = [
    (1, 16, 512, 4, 1),
    (1, 32, 512, 4, 1),
    (1, 16, 256, 4, 2),
    (1, 16, 256, 4, 3),
    (1, 32, 256, 4, 3),
    (1, 16, 256, 2, 1),
    (1, 8, 512, 4, 1),
]
EXTENDED_DOT = [
    (16, 16, 256, 4, 3),
    (16, 16, 512, 4, 2),
    (16, 32, 256, 4, 4),
    (16, 32, 512, 4, 2),
    (16, 32, 512, 4, 3),
    (16, 64, 256, 4, 3),
    (16, 64, 256, 8, 3),
    (16, 32, 128, 4, 3),
]


def skinny_candidates(m: int, quick: bool, shape: tuple[int, int] | None = None) -> list[tuple[SkinnyConfig, bool]]:
    """(config, extended) pairs to try at this M: the base set for every shape, plus the extended
    set for EXTENDED_SHAPES at M <= 16 (not in --quick)."""
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
        splits = splits[:3]
    else:
        tiles = [(64, 64, 64, 4, 4), (64, 128, 64, 4, 4), (64, 64, 128, 4, 3)]
        if m >= 128:
            tiles.append((128, 128, 64, 8, 3))
        splits = splits[:2]
    if quick:
        tiles, extended = tiles[:3], []
    if shape is not None and shape not in EXTENDED_SHAPES:
        extended = []
    out = [(SkinnyConfig(bm, bn, bk, s, nw, ns), False) for bm, bn, bk, nw, ns in tiles for s in splits]
    return out + [(SkinnyConfig(bm, bn, bk, s, nw, ns), True) for bm, bn, bk, nw, ns in extended for s in splits]


class Timer:
    def __init__(self, kind: str):
        self.kind = kind

    def __call__(self, fn: Callable[[int], object], variants: int, est_us: float) -> float:
        """Median microseconds per call of fn(i), i cycling over `variants` data copies."""
        if self.kind == "do_bench":
            import triton.testing

            counter = iter(range(1 << 62))
            return 1e3 * triton.testing.do_bench(
                lambda: fn(next(counter) % variants), warmup=5, rep=25, return_mode="median"
            )
        calls = max(variants, min(200, math.ceil(300.0 / max(est_us, 0.5))))
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for i in range(min(variants, 3)):
                fn(i)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(calls):
                fn(i % variants)
        graph.replay()
        times = []
        for _ in range(7):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(1e3 * start.elapsed_time(end) / calls)
        del graph
        return statistics.median(times)


def copy_bandwidth() -> float:
    """Device-to-device copy GB/s (read + write bytes) of a 1 GiB buffer."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device=DEVICE)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        dst.copy_(src)
    end.record()
    end.synchronize()
    return 2 * src.numel() * 10 / (start.elapsed_time(end) * 1e-3) / 1e9


def md_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def write_csv(path: Path, rows: list[dict]) -> None:
    if not rows:
        return
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def time_candidate(
    timer: Timer, fn: Callable[[int], torch.Tensor], ref: torch.Tensor, copies: int, est: float, label: str
) -> float | None:
    """Microseconds per call of fn, or None (reported) if it does not compile, fit or match ref."""
    try:
        err = rel_err(fn(0), ref)
        if not err < 2e-2:
            raise RuntimeError(f"wrong result (rel err {err:.2e})")
        return timer(fn, copies, est)
    except Exception as e:  # a config that does not compile or fit is reported, not fatal
        print(f"  skip {label}: {str(e).splitlines()[0][:120] if str(e) else type(e).__name__}", file=sys.stderr)
        return None


def bench_linear(args, timer: Timer, peak: float) -> tuple[list[dict], str]:
    dtype = DTYPE
    rows, best, ranked = [], {}, {}
    deadline = args.t0 + 0.55 * args.budget_s  # extended candidates stop here; the base set always runs
    skipped = 0
    for n, k in sorted(SHAPES, key=lambda s: s not in EXTENDED_SHAPES):  # extended shapes before the deadline
        wbytes = n * k * dtype.itemsize
        copies = max(1, min(16, math.ceil(ROTATE_BYTES / wbytes)))
        ws = [torch.randn(n, k, device=DEVICE).mul_(0.02).to(dtype) for _ in range(copies)]
        for m in args.ms:
            x = torch.randn(m, k, device=DEVICE).to(dtype)
            est = wbytes / (peak * 1e3)
            ref = F.linear(x, ws[0])
            results = [("cublas", None, timer(lambda i, x=x, ws=ws: F.linear(x, ws[i]), copies, est))]
            for cfg, extended in skinny_candidates(m, args.quick, (n, k)):
                if extended and time.time() > deadline:
                    skipped += 1
                    continue
                fn = lambda i, x=x, ws=ws, cfg=cfg: linear.linear_with_config(x, ws[i], cfg)
                us = time_candidate(timer, fn, ref, copies, est, f"N={n} K={k} M={m} {tuple(cfg)}")
                if us is not None:
                    results.append(("triton", cfg, us))
            for impl, cfg, us in results:
                gbps = wbytes / (us * 1e-6) / 1e9
                rows.append(
                    dict(
                        N=n,
                        K=k,
                        M=m,
                        impl=impl,
                        config="" if cfg is None else str(tuple(cfg)),
                        us=round(us, 2),
                        GBps=round(gbps, 1),
                        frac=round(gbps / peak, 3),
                    )
                )
            tri = sorted((r for r in results if r[0] == "triton"), key=lambda r: r[2])
            ranked[(n, k, m)] = [(cfg, us) for _, cfg, us in tri]
            best[(n, k, m)] = (results[0][2], tri[0] if tri else None)
            b = best[(n, k, m)][1]
            print(
                f"  linear N={n} K={k} M={m}: cuBLAS {results[0][2]:.1f} us, best triton {b[2]:.1f} us {tuple(b[1])}"
                if b
                else "  (no triton config ran)",
                flush=True,
            )
        del ws
    args.state.update(linear_best=best, linear_ranked=ranked)
    md = linear_report(best, args.ms, peak, args.state)
    if skipped:
        md += f"\n\n{skipped} extended candidates skipped: past {0.55 * args.budget_s:.0f} s of --budget-s."
    return rows, md


def linear_report(best: dict, ms: list[int], peak: float, state: dict | None = None) -> str:
    out, table, configs, crossover = [], [], {}, {}
    for n, k in SHAPES:
        wbytes = n * k * DTYPE.itemsize
        for m in ms:
            cub_us, tri = best[(n, k, m)]
            if tri is None:
                continue
            _, cfg, us = tri
            gb = lambda t, wb=wbytes: wb / (t * 1e-6) / 1e9
            table.append(
                [
                    f"{SHAPE_NAMES[(n, k)]} {n}x{k}",
                    m,
                    f"{cub_us:.1f}",
                    f"{gb(cub_us):.0f}",
                    f"{gb(cub_us) / peak:.2f}",
                    f"{us:.1f}",
                    f"{gb(us):.0f}",
                    f"{gb(us) / peak:.2f}",
                    str(tuple(cfg)),
                    f"{cub_us / us:.2f}x",
                ]
            )
            if us < cub_us:  # a tuned shape's missing bucket means cuBLAS (see linear.skinny_config)
                configs.setdefault((n, k), {})[m] = cfg
            elif (n, k) not in crossover:
                crossover[(n, k)] = m
    out.append(f"### Skinny-M linear vs cuBLAS ({DTYPE}; GB/s = weight bytes / time)\n")
    out.append(
        md_table(
            [
                "shape",
                "M",
                "cuBLAS us",
                "GB/s",
                "frac",
                "triton us",
                "GB/s",
                "frac",
                "config (bm,bn,bk,split,warps,stages)",
                "speedup",
            ],
            table,
        )
    )
    out.append(
        "\nCrossover (first M where cuBLAS is faster): "
        + ", ".join(f"{SHAPE_NAMES[s]}={crossover.get(s, '>' + str(ms[-1]))}" for s in SHAPES)
    )
    # The decode step of Qwen3-4B: 36 x (qkv, o, gate_up, down) + lm_head, at each M.
    step = {}
    for m in ms:
        weight = lambda s: 1 if SHAPE_NAMES[s] == "lm_head" else LAYERS_4B
        if all(best[(n, k, m)][1] for n, k in SHAPES):
            step[m] = (
                sum(weight(s) * best[(*s, m)][0] for s in SHAPES),
                sum(weight(s) * best[(*s, m)][1][2] for s in SHAPES),
            )
    m_max = 0
    for m in ms:
        if m in step and step[m][1] < step[m][0]:
            m_max = m
        else:
            break
    out.append(
        "\nQwen3-4B decode-step projection time (36 layers + lm_head), cuBLAS vs triton (us): "
        + ", ".join(f"M={m}: {c:.0f} vs {t:.0f}" for m, (c, t) in step.items())
    )
    if state is not None:
        state.update(linear_configs=configs, m_max=m_max, linear_ms=list(ms))
    return "\n".join(out)


def bench_fused(args, timer: Timer, peak: float) -> tuple[list[dict], str]:
    """silu_mul_linear on the down shape: the fused kernel vs silu_and_mul + the best of cuBLAS and
    the skinny kernel (the unfused pair the engine would otherwise run)."""
    dtype, (n, inter) = DTYPE, DOWN_SHAPE
    ranked = args.state.get("linear_ranked", {})
    wbytes = n * inter * dtype.itemsize
    copies = max(1, min(16, math.ceil(ROTATE_BYTES / wbytes)))
    ws = [torch.randn(n, inter, device=DEVICE).mul_(0.02).to(dtype) for _ in range(copies)]
    current = tuning.tables_for(ws[0].device)  # the table the engine runs with now
    rows, table, best = [], [], {}
    for m in [m for m in FUSED_MS if m in args.ms]:
        x = torch.randn(m, 2 * inter, device=DEVICE).mul_(2.0).to(dtype)
        ref = F.linear(activation.silu_and_mul_ref(x).float(), ws[0].float())
        est = wbytes / (peak * 1e3)
        top = [cfg for cfg, _ in ranked.get((n, inter, m), [])][: 2 if args.quick else 4]
        down_cfg = top[0] if top else linear.skinny_config(m, n, inter, current)
        unfused = [("silu_and_mul+cublas", None, lambda i, x=x, ws=ws: F.linear(activation.silu_and_mul(x), ws[i]))]
        if down_cfg is not None:
            fn = lambda i, x=x, ws=ws, cfg=down_cfg: linear.linear_with_config(activation.silu_and_mul(x), ws[i], cfg)
            unfused.append(("silu_and_mul+triton", down_cfg, fn))
        wide = (
            [(1, 32, 256, 4, 4, 1), (1, 32, 512, 4, 8, 1)]
            if m == 1
            else [(16, 64, 128, 4, 4, 4), (16, 64, 256, 4, 4, 3), (16, 128, 128, 2, 4, 3)]
        )
        cands = list(
            dict.fromkeys(
                top
                + [SkinnyConfig(*c) for c in wide[: 1 if args.quick else 3]]
                + [fused_linear.silu_mul_linear_config(m, n, inter, current)]
            )
        )
        results = []
        for name, cfg, fn in unfused:
            us = time_candidate(timer, fn, ref, copies, est, f"{name} M={m}")
            if us is not None:
                results.append((name, cfg, us))
        for cfg in (c for c in cands if c is not None):
            fn = lambda i, x=x, cfg=cfg, ws=ws: fused_linear.silu_mul_linear_with_config(x, ws[i], cfg)
            us = time_candidate(timer, fn, ref, copies, est, f"fused N={n} I={inter} M={m} {tuple(cfg)}")
            if us is not None:
                results.append(("fused", cfg, us))
        for impl, cfg, us in results:
            rows.append(
                dict(
                    N=n,
                    I=inter,
                    M=m,
                    impl=impl,
                    config="" if cfg is None else str(tuple(cfg)),
                    us=round(us, 2),
                    frac=round(wbytes / (us * 1e-6) / 1e9 / peak, 3),
                )
            )
        base = min((r for r in results if r[0] != "fused"), key=lambda r: r[2], default=None)
        fused = min((r for r in results if r[0] == "fused"), key=lambda r: r[2], default=None)
        best[m] = (base, fused)
        if base and fused:
            print(
                f"  fused M={m}: unfused {base[2]:.1f} us ({base[0]}), fused {fused[2]:.1f} us {tuple(fused[1])}",
                flush=True,
            )
            frac = wbytes / (fused[2] * 1e-6) / 1e9 / peak
            table.append(
                [
                    m,
                    f"{base[2]:.1f}",
                    base[0],
                    f"{fused[2]:.1f}",
                    f"{frac:.2f}",
                    str(tuple(fused[1])),
                    f"{base[2] / fused[2]:.2f}x",
                    f"{LAYERS_4B * (base[2] - fused[2]):+.0f}",
                ]
            )
    del ws
    configs = {m: f[1] for m, (b, f) in best.items() if b and f and f[2] < b[2]}
    args.state.update(fused_configs=configs, fused_ms=[m for m in FUSED_MS if m in args.ms])
    return rows, (
        f"### silu_mul_linear (SwiGLU + down {n}x{inter} fused) vs silu_and_mul + the best unfused down "
        f"({DTYPE})\n\n"
        + md_table(
            ["M", "unfused us", "unfused path", "fused us", "frac", "fused config", "speedup", "36 layers: us saved"],
            table,
        )
    )


def bench_norm(args, timer: Timer, peak: float) -> tuple[list[dict], str]:
    """add_rms_norm_linear on the projections that follow a residual add + RMSNorm (q|k|v, gate|up):
    the NORM-prologue kernel at the shape's best linear configs vs add_rms_norm + the best of cuBLAS
    and the skinny kernel."""
    dtype, rows, table = DTYPE, [], []
    ranked = args.state.get("linear_ranked", {})
    configs: dict[tuple[int, int], dict[int, SkinnyConfig]] = {}
    for n, k in NORM_SHAPES:
        wbytes = n * k * dtype.itemsize
        copies = max(1, min(16, math.ceil(ROTATE_BYTES / wbytes)))
        ws = [torch.randn(n, k, device=DEVICE).mul_(0.02).to(dtype) for _ in range(copies)]
        nw = torch.randn(k, device=DEVICE).mul_(0.1).add_(1.0).to(dtype)
        current = tuning.tables_for(ws[0].device)
        est = wbytes / (peak * 1e3)
        for m in [m for m in FUSED_MS if m in args.ms]:
            x, r = (torch.randn(m, k, device=DEVICE).to(dtype) for _ in range(2))
            normed, _ = norm.add_rms_norm_ref(x, r, nw, 1e-6)
            ref = F.linear(normed.float(), ws[0].float())
            top = [cfg for cfg, _ in ranked.get((n, k, m), [])][: 2 if args.quick else 3]
            lin_cfg = top[0] if top else linear.skinny_config(m, n, k, current)
            unfused = [
                (
                    "add_rms_norm+cublas",
                    None,
                    lambda i, x=x, r=r, ws=ws, nw=nw: F.linear(norm.add_rms_norm(x, r, nw, 1e-6)[0], ws[i]),
                )
            ]
            if lin_cfg is not None:
                unfused.append(
                    (
                        "add_rms_norm+triton",
                        lin_cfg,
                        lambda i, x=x, r=r, ws=ws, nw=nw, cfg=lin_cfg: linear.linear_with_config(
                            norm.add_rms_norm(x, r, nw, 1e-6)[0], ws[i], cfg
                        ),
                    )
                )
            cands = list(dict.fromkeys(top + [fused_linear.add_rms_norm_linear_config(m, n, k, current)]))
            results = []
            for name, cfg, fn in unfused:
                us = time_candidate(timer, fn, ref, copies, est, f"{name} N={n} K={k} M={m}")
                if us is not None:
                    results.append((name, cfg, us))
            for cfg in (c for c in cands if c is not None):
                fn = lambda i, x=x, r=r, ws=ws, nw=nw, cfg=cfg: fused_linear.add_rms_norm_linear_with_config(
                    x, r, nw, 1e-6, ws[i], cfg
                )[0]
                us = time_candidate(timer, fn, ref, copies, est, f"norm-fused N={n} K={k} M={m} {tuple(cfg)}")
                if us is not None:
                    results.append(("fused", cfg, us))
            for impl, cfg, us in results:
                rows.append(
                    dict(
                        N=n,
                        K=k,
                        M=m,
                        impl=impl,
                        config="" if cfg is None else str(tuple(cfg)),
                        us=round(us, 2),
                        frac=round(wbytes / (us * 1e-6) / 1e9 / peak, 3),
                    )
                )
            base = min((r for r in results if r[0] != "fused"), key=lambda r: r[2], default=None)
            fused = min((r for r in results if r[0] == "fused"), key=lambda r: r[2], default=None)
            if base and fused:
                if fused[2] < base[2]:
                    configs.setdefault((n, k), {})[m] = fused[1]
                print(
                    f"  norm-fused N={n} K={k} M={m}: unfused {base[2]:.1f} us ({base[0]}), fused {fused[2]:.1f} us "
                    f"{tuple(fused[1])}",
                    flush=True,
                )
                table.append(
                    [
                        f"{SHAPE_NAMES.get((n, k), '')} {n}x{k}",
                        m,
                        f"{base[2]:.1f}",
                        base[0],
                        f"{fused[2]:.1f}",
                        str(tuple(fused[1])),
                        f"{base[2] / fused[2]:.2f}x",
                        f"{LAYERS_4B * (base[2] - fused[2]):+.0f}",
                    ]
                )
        del ws
    args.state.update(norm_configs=configs, norm_ms=[m for m in FUSED_MS if m in args.ms])
    return rows, (
        f"### add_rms_norm_linear (residual add + RMSNorm in the projection's prologue) vs add_rms_norm + "
        f"the best unfused projection ({DTYPE})\n\n"
        + md_table(
            ["shape", "M", "unfused us", "unfused path", "fused us", "fused config", "speedup", "36 layers: us saved"],
            table,
        )
    )


def bench_linear_invariant(args, timer: Timer, peak: float) -> tuple[list[dict], str]:
    dtype, rows, table = DTYPE, [], []
    tilings = [
        SkinnyConfig(16, 64, 64, 1, 4, 4),
        linear.INVARIANT_CONFIG,
        SkinnyConfig(64, 64, 64, 1, 4, 4),
        SkinnyConfig(64, 128, 64, 1, 4, 3),
    ]
    for n, k in SHAPES:
        wbytes = n * k * dtype.itemsize
        copies = max(1, min(16, math.ceil(ROTATE_BYTES / wbytes)))
        ws = [torch.randn(n, k, device=DEVICE).mul_(0.02).to(dtype) for _ in range(copies)]
        for m in (1, 8, 64):
            x = torch.randn(m, k, device=DEVICE).to(dtype)
            est = wbytes / (peak * 1e3)
            cub = timer(lambda i, x=x, ws=ws: F.linear(x, ws[i]), copies, est)
            line = [f"{SHAPE_NAMES[(n, k)]}", m, f"{cub:.1f}"]
            for cfg in tilings:
                fn = lambda i, x=x, ws=ws, cfg=cfg: linear.linear_with_config(x, ws[i], cfg)
                us = timer(fn, copies, est)
                rows.append(dict(N=n, K=k, M=m, config=str(tuple(cfg)), us=round(us, 2), cublas_us=round(cub, 2)))
                line.append(f"{us:.1f}")
            table.append(line)
        del ws
    header = ["shape", "M", "cuBLAS us"] + [f"{c.block_m}x{c.block_n}x{c.block_k} us" for c in tilings]
    return (
        rows,
        f"### Batch-invariant GEMM tilings ({DTYPE}, us; current: INVARIANT_CONFIG = "
        f"{tuple(linear.INVARIANT_CONFIG)})\n\n" + md_table(header, table),
    )


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


def bench_attention(args, timer: Timer, peak: float) -> tuple[list[dict], str]:
    rows, table = [], []
    for batch, ctx, span in ATTN_CASES:
        q, kc, vc, bt, seq_lens, qsl = paged_case(batch, ctx, span, **ATTN_GEOMETRY)
        kv_bytes = 2 * batch * (ctx + span) * kc.shape[2] * kc.shape[3] * kc.element_size()
        copies = max(1, min(512, math.ceil(ROTATE_BYTES / kv_bytes)))
        caches = [(kc, vc)] + [(kc.clone(), vc.clone()) for _ in range(copies - 1)]
        scale = kc.shape[-1] ** -0.5
        ref = attention.paged_attention_ref(q, kc, vc, bt, seq_lens, qsl, span, scale)
        variants = [("auto", {})]
        if span == 1:
            variants += [(f"splits={s}", {"num_splits": s}) for s in (1, 4, 16, 32)]
            variants.append(("decode_block_n=64", {"decode_block_n": 64}))
        variants.append(("batch_invariant", {"batch_invariant": True}))
        auto_cfg = attention.attention_config(
            batch, kc.shape[2], q.shape[1] // kc.shape[2], span, bt.shape[1] * kc.shape[1], q.device, False
        )
        line = [batch, ctx, span, str(auto_cfg)]
        for name, kw in variants:

            def fn(i, caches=caches, kw=kw, q=q, bt=bt, seq_lens=seq_lens, qsl=qsl, span=span, scale=scale):
                kw = dict(kw)
                block_n = kw.pop("decode_block_n", attention.DECODE_BLOCK_N)
                saved, attention.DECODE_BLOCK_N = attention.DECODE_BLOCK_N, block_n  # config read at call time
                try:
                    return attention.paged_attention(q, *caches[i], bt, seq_lens, qsl, span, scale, True, **kw)
                finally:
                    attention.DECODE_BLOCK_N = saved

            err = rel_err(fn(0), ref)
            us = timer(fn, copies, kv_bytes / (peak * 1e3))
            gbps = kv_bytes / (us * 1e-6) / 1e9
            rows.append(
                dict(
                    batch=batch,
                    ctx=ctx,
                    span=span,
                    variant=name,
                    us=round(us, 2),
                    kv_GBps=round(gbps, 1),
                    frac=round(gbps / peak, 3),
                    rel_err=f"{err:.1e}",
                )
            )
            line.append(f"{us:.1f} ({gbps / peak:.2f})")
        if span != 1:
            line[5:5] = ["-"] * 5
        table.append(line)
        print(f"  attention B={batch} ctx={ctx} span={span}: {line[4:]}", flush=True)
        del caches
    header = [
        "batch",
        "ctx",
        "span",
        "auto (BQ,BM,BN,splits)",
        "auto us (frac)",
        "splits=1",
        "splits=4",
        "splits=16",
        "splits=32",
        "decode BLOCK_N=64",
        "batch_invariant",
    ]
    return rows, f"### Paged attention {ATTN_GEOMETRY}, {DTYPE}: us (fraction of peak on K+V bytes)\n\n" + md_table(
        header, table
    )


def tuned_from_sweep(state: dict, old: TunedTables, full_ms: bool) -> TunedTables:
    """`old` with every (shape, M bucket) this run measured replaced by its result: the fastest config
    that passed the correctness check where it beat cuBLAS (linear) / the unfused pair (fused),
    else no entry (cuBLAS / the unfused pair serves that bucket)."""
    lin = {shape: dict(per_m) for shape, per_m in old.linear.items()}
    if "linear_best" in state:
        configs = state["linear_configs"]
        for n, k, m in state["linear_best"]:
            per_m = lin.setdefault((n, k), {})
            if m in configs.get((n, k), {}):
                per_m[m] = configs[(n, k)][m]
            else:
                per_m.pop(m, None)
    fused = {shape: dict(per_m) for shape, per_m in old.silu_mul_linear.items()}
    if "fused_configs" in state:
        per_m = fused.setdefault(DOWN_SHAPE, {})
        for m in state["fused_ms"]:
            if m in state["fused_configs"]:
                per_m[m] = state["fused_configs"][m]
            else:
                per_m.pop(m, None)
    normed = {shape: dict(per_m) for shape, per_m in old.add_rms_norm_linear.items()}
    if "norm_configs" in state:
        for shape in NORM_SHAPES:
            per_m = normed.setdefault(shape, {})
            for m in state["norm_ms"]:
                if m in state["norm_configs"].get(shape, {}):
                    per_m[m] = state["norm_configs"][shape][m]
                else:
                    per_m.pop(m, None)
    m_max = state["m_max"] if "m_max" in state and full_ms else old.m_max
    return TunedTables(
        device=old.device,
        m_max=m_max,
        fused_m_max=old.fused_m_max,
        linear=lin,
        silu_mul_linear=fused,
        norm_m_max=old.norm_m_max,
        add_rms_norm_linear=normed,
    )


def table_changes(old: TunedTables, new: TunedTables) -> list[str]:
    lines = [f"linear m_max {old.m_max} -> {new.m_max}"] if old.m_max != new.m_max else []
    pairs = (
        ("linear", old.linear, new.linear),
        ("silu_mul_linear", old.silu_mul_linear, new.silu_mul_linear),
        ("add_rms_norm_linear", old.add_rms_norm_linear, new.add_rms_norm_linear),
    )
    for what, a, b in pairs:
        for shape in sorted(set(a) | set(b)):
            pa, pb = a.get(shape, {}), b.get(shape, {})
            for m in sorted(set(pa) | set(pb)):
                if pa.get(m) != pb.get(m):
                    show = lambda c: "cuBLAS/unfused" if c is None else str(tuple(c))
                    lines.append(f"{what} {shape[0]}x{shape[1]} M={m}: {show(pa.get(m))} -> {show(pb.get(m))}")
    return lines


def write_tuned(args, report: list[str], install: bool) -> None:
    """The table from this run to DIR/tuned/<slug>.json, and with `install` also to
    engine/kernels/tuned/<slug>.json (where the kernels read it)."""
    name = torch.cuda.get_device_name()
    old = tuning.load(name)
    new = tuned_from_sweep(args.state, old if old.source else TunedTables(tuning.device_slug(name)), args.ms == MS)
    note = (
        f"python -m engine.bench.kernels{' --quick' if args.quick else ''} --write-tuned on {name}, "
        f"torch {torch.__version__}, {time.strftime('%Y-%m-%d')}"
    )
    text = tuning.dumps(new, name, note)
    tuning.parse(json.loads(text))  # what the kernels will read back
    paths = [args.out / "tuned" / f"{tuning.device_slug(name)}.json"] + ([tuning.tuned_path(name)] if install else [])
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    changes = table_changes(old, new)
    where = ", ".join(str(p) for p in paths) + ("" if install else " (not installed: no --write-tuned)")
    report.append(
        f"### Tuned table written: {where}\n\n"
        + (f"Changes against {old.source}:\n" if old.source else "New table (no previous file):\n")
        + "\n".join(f"- {c}" for c in changes or ["(none)"])
        + "\n\n```json\n"
        + text
        + "```\n"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="directory for the CSVs and report.md")
    p.add_argument("--timer", choices=["graph", "do_bench"], default="graph")
    p.add_argument("--peak-gbps", type=float, default=4300.0, help="copy bandwidth the fractions refer to")
    p.add_argument("--quick", action="store_true", help="fewer configs (a smoke run)")
    p.add_argument("--ms", type=lambda s: [int(v) for v in s.split(",")], default=MS)
    p.add_argument("--skip", default="", help="comma list of sections to skip: linear,fused,norm,invariant,attention")
    p.add_argument(
        "--budget-s",
        type=float,
        default=100.0,
        help="wall-time target: the extended linear candidates stop at 55%% of it",
    )
    p.add_argument(
        "--write-tuned",
        action="store_true",
        help="install this run's tuned table as engine/kernels/tuned/<device>.json (it always goes to DIR/tuned/)",
    )
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("engine.bench.kernels needs a CUDA device", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    timer, t0 = Timer(args.timer), time.time()
    args.t0, args.state = t0, {}
    skip = set(args.skip.split(","))
    copy = copy_bandwidth()
    report = [
        f"# Kernel micro-benchmark: {torch.cuda.get_device_name()}, torch {torch.__version__}, timer={args.timer}\n",
        f"Measured D2D copy bandwidth: {copy:.0f} GB/s (read+write); "
        f"fractions below are of {args.peak_gbps:.0f} GB/s.\n",
    ]
    sections = [
        ("linear", bench_linear, "linear.csv"),
        ("fused", bench_fused, "silu_mul_linear.csv"),
        ("norm", bench_norm, "add_rms_norm_linear.csv"),
        ("invariant", bench_linear_invariant, "linear_invariant.csv"),
        ("attention", bench_attention, "attention.csv"),
    ]
    failed, written = [], False
    for name, fn, csv_name in sections:
        if name in skip:
            continue
        print(f"== {name} ({time.time() - t0:.0f}s)", flush=True)
        try:
            rows, md = fn(args, timer, args.peak_gbps)
        except Exception:  # reported; the other sections (and the tuned table) still run
            traceback.print_exc()
            failed.append(name)
            report.append(f"### {name}: FAILED (see stderr)\n")
            continue
        write_csv(args.out / csv_name, rows)
        report.append(md + "\n")
        if name == "norm":  # before the sections that do not feed it
            write_tuned(args, report, args.write_tuned)
            written = True
    if not written and not {"linear", "fused", "norm"} <= skip:
        write_tuned(args, report, args.write_tuned)
    report.append(f"Total bench time: {time.time() - t0:.0f}s")
    text = "\n".join(report)
    (args.out / "report.md").write_text(text + "\n")
    print("\n" + text)
    if failed:
        print(f"sections failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
