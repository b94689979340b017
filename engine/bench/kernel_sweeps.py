"""The kernel micro-benchmark's sections that feed the tuned table (`(args, timer, peak) -> (CSV rows,
Markdown)`, results left in `args.state`): skinny linear vs cuBLAS, fused SwiGLU + down, add + RMSNorm
prologue. Time-only sections: kernel_sweeps_untuned.py."""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from engine.bench import kernel_cases as cases
from engine.bench.kernel_report import linear_report
from engine.bench.kernel_timing import Result, Timer, time_candidate, time_paths, unfused_vs_fused
from engine.bench.report import markdown_table
from engine.kernels import activation, fused_linear, linear, norm, tuning
from engine.kernels.tuning import SkinnyConfig


def bench_linear(args, timer: Timer, peak: float) -> tuple[list[dict], str]:
    rows, best, ranked = [], {}, {}
    deadline = args.t0 + 0.55 * args.budget_s  # extended candidates stop here; the base set always runs
    skipped = 0
    for n, k in sorted(cases.SHAPES, key=lambda s: s not in cases.EXTENDED_SHAPES):  # extended shapes first
        wbytes, copies, ws = cases.rotated_weights(n, k)
        for m in args.ms:
            x = torch.randn(m, k, device=cases.DEVICE).to(cases.DTYPE)
            est = wbytes / (peak * 1e3)
            ref = F.linear(x, ws[0])
            results = [("cublas", None, timer(lambda i, x=x, ws=ws: F.linear(x, ws[i]), copies, est))]
            defer = (n, k) in cases.RESIDUAL_SHAPES
            for cfg, extended in cases.skinny_candidates(m, args.quick, (n, k)):
                if extended and time.time() > deadline:
                    skipped += 1
                    continue
                fn = lambda i, x=x, ws=ws, cfg=cfg, d=defer: linear.linear_with_config(x, ws[i], cfg, defer=d)
                us = time_candidate(timer, fn, ref, copies, est, f"N={n} K={k} M={m} {tuple(cfg)}")
                if us is not None:
                    results.append(("triton", cfg, us))
            for impl, cfg, us in results:
                gbps = wbytes / (us * 1e-6) / 1e9
                row = dict(N=n, K=k, M=m, impl=impl, config="" if cfg is None else str(tuple(cfg)), us=round(us, 2))
                rows.append(row | dict(GBps=round(gbps, 1), frac=round(gbps / peak, 3)))
            tri = sorted((r for r in results if r[0] == "triton"), key=lambda r: r[2])
            ranked[(n, k, m)] = [(cfg, us) for _, cfg, us in tri]
            best[(n, k, m)] = (results[0][2], tri[0] if tri else None)
            b, head = best[(n, k, m)][1], f"  linear N={n} K={k} M={m}: cuBLAS {results[0][2]:.1f} us"
            print(f"{head}, best triton {b[2]:.1f} us {tuple(b[1])}" if b else "  (no triton config ran)", flush=True)
        del ws
    args.state.update(linear_best=best, linear_ranked=ranked)
    md = linear_report(best, args.ms, peak, args.state)
    if skipped:
        md += f"\n\n{skipped} extended candidates skipped: past {0.55 * args.budget_s:.0f} s of --budget-s."
    return rows, md


def fused_rows(results: list[Result], wbytes: int, peak: float, **case) -> list[dict]:
    """CSV rows of a fused sweep's timed paths: the case columns, then impl, config, us and the
    fraction of the copy bandwidth on the weight bytes."""
    return [
        dict(
            **case,
            impl=impl,
            config="" if cfg is None else str(tuple(cfg)),
            us=round(us, 2),
            frac=round(wbytes / (us * 1e-6) / 1e9 / peak, 3),
        )
        for impl, cfg, us in results
    ]


def versus_cells(base: Result, fused: Result) -> list:
    """A fused sweep's table cells: unfused us and path, fused us; speedup and the 4B's us saved a step."""
    saved = f"{cases.LAYERS_4B * (base[2] - fused[2]):+.0f}"
    return [f"{base[2]:.1f}", base[0], f"{fused[2]:.1f}", f"{base[2] / fused[2]:.2f}x", saved]


def bench_fused(args, timer: Timer, peak: float) -> tuple[list[dict], str]:
    """silu_mul_linear on the down shape: the fused kernel vs silu_and_mul + the best of cuBLAS and
    the skinny kernel (the unfused pair the engine would otherwise run)."""
    n, inter = cases.DOWN_SHAPE
    ranked = args.state.get("linear_ranked", {})
    wbytes, copies, ws = cases.rotated_weights(n, inter)
    current = tuning.tables_for(ws[0].device)  # the table the engine runs with now
    rows, table, best = [], [], {}
    for m in cases.fused_ms(args.ms):
        x = torch.randn(m, 2 * inter, device=cases.DEVICE).mul_(2.0).to(cases.DTYPE)
        ref = F.linear(activation.silu_and_mul_ref(x).float(), ws[0].float())
        est = wbytes / (peak * 1e3)
        top = [cfg for cfg, _ in ranked.get((n, inter, m), [])][: 2 if args.quick else 4]
        down_cfg = top[0] if top else linear.skinny_config(m, n, inter, current)
        unfused = [("silu_and_mul+cublas", None, lambda i, x=x, ws=ws: F.linear(activation.silu_and_mul(x), ws[i]))]
        if down_cfg is not None:
            fn = lambda i, x=x, ws=ws, cfg=down_cfg: linear.linear_with_config(
                activation.silu_and_mul(x), ws[i], cfg, defer=True
            )
            unfused.append(("silu_and_mul+triton", down_cfg, fn))
        current_cfg = fused_linear.silu_mul_linear_config(m, n, inter, current)
        cands = list(dict.fromkeys(top + cases.wide_fused_tiles(m, args.quick) + [current_cfg]))
        paths = [(name, cfg, fn, f"{name} M={m}") for name, cfg, fn in unfused]
        for cfg in (c for c in cands if c is not None):
            fn = lambda i, x=x, cfg=cfg, ws=ws: fused_linear.silu_mul_linear_with_config(x, ws[i], cfg, defer=True)
            paths.append(("fused", cfg, fn, f"fused N={n} I={inter} M={m} {tuple(cfg)}"))
        results = time_paths(timer, paths, ref, copies, est)
        rows += fused_rows(results, wbytes, peak, N=n, I=inter, M=m)
        base, fused = unfused_vs_fused(results)
        best[m] = (base, fused)
        if base and fused:
            got = f"unfused {base[2]:.1f} us ({base[0]}), fused {fused[2]:.1f} us {tuple(fused[1])}"
            print(f"  fused M={m}: {got}", flush=True)
            frac = f"{wbytes / (fused[2] * 1e-6) / 1e9 / peak:.2f}"
            cells = versus_cells(base, fused)
            table.append([m, *cells[:3], frac, str(tuple(fused[1])), *cells[3:]])
    del ws
    configs = {m: f[1] for m, (b, f) in best.items() if b and f and f[2] < b[2]}
    args.state.update(fused_configs=configs, fused_ms=cases.fused_ms(args.ms))
    title = f"### silu_mul_linear (SwiGLU + down {n}x{inter} fused) vs silu_and_mul + the best unfused down"
    header = ["M", "unfused us", "unfused path", "fused us", "frac", "fused config", "speedup", "36 layers: us saved"]
    return rows, f"{title} ({cases.DTYPE})\n\n" + markdown_table(header, table)


def bench_norm(args, timer: Timer, peak: float) -> tuple[list[dict], str]:
    """add_rms_norm_linear on the projections that follow a residual add + RMSNorm (q|k|v, gate|up):
    the NORM-prologue kernel at the shape's best linear configs vs add_rms_norm + the best of cuBLAS
    and the skinny kernel."""
    rows, table = [], []
    ranked = args.state.get("linear_ranked", {})
    configs: dict[tuple[int, int], dict[int, SkinnyConfig]] = {}
    for n, k in cases.NORM_SHAPES:
        wbytes, copies, ws = cases.rotated_weights(n, k)
        nw = torch.randn(k, device=cases.DEVICE).mul_(0.1).add_(1.0).to(cases.DTYPE)
        current = tuning.tables_for(ws[0].device)
        est = wbytes / (peak * 1e3)
        for m in cases.fused_ms(args.ms):
            x, r = (torch.randn(m, k, device=cases.DEVICE).to(cases.DTYPE) for _ in range(2))
            normed, _ = norm.add_rms_norm_ref(x, r, nw, 1e-6)
            ref = F.linear(normed.float(), ws[0].float())
            top = [cfg for cfg, _ in ranked.get((n, k, m), [])][: 2 if args.quick else 3]
            lin_cfg = top[0] if top else linear.skinny_config(m, n, k, current)
            fn = lambda i, x=x, r=r, ws=ws, nw=nw: F.linear(norm.add_rms_norm(x, r, nw, 1e-6)[0], ws[i])
            unfused = [("add_rms_norm+cublas", None, fn)]
            if lin_cfg is not None:
                fn = lambda i, x=x, r=r, ws=ws, nw=nw, cfg=lin_cfg: linear.linear_with_config(
                    norm.add_rms_norm(x, r, nw, 1e-6)[0], ws[i], cfg
                )
                unfused.append(("add_rms_norm+triton", lin_cfg, fn))
            # the one-pass prologue needs whole rows: the linear's best tilings without split-K
            unsplit = [cfg._replace(split_k=1) for cfg in top]
            cands = list(dict.fromkeys(unsplit + [fused_linear.add_rms_norm_linear_config(m, n, k, current)]))
            paths = [(name, cfg, fn, f"{name} N={n} K={k} M={m}") for name, cfg, fn in unfused]
            for cfg in (c for c in cands if c is not None):
                fn = lambda i, x=x, r=r, ws=ws, nw=nw, cfg=cfg: fused_linear.add_rms_norm_linear_with_config(
                    x, r, nw, 1e-6, ws[i], cfg
                )[0]
                paths.append(("fused", cfg, fn, f"norm-fused N={n} K={k} M={m} {tuple(cfg)}"))
            results = time_paths(timer, paths, ref, copies, est)
            rows += fused_rows(results, wbytes, peak, N=n, K=k, M=m)
            base, fused = unfused_vs_fused(results)
            if base and fused:
                if fused[2] < base[2]:
                    configs.setdefault((n, k), {})[m] = fused[1]
                got = f"unfused {base[2]:.1f} us ({base[0]}), fused {fused[2]:.1f} us {tuple(fused[1])}"
                print(f"  norm-fused N={n} K={k} M={m}: {got}", flush=True)
                cells = versus_cells(base, fused)
                shape = f"{cases.SHAPE_NAMES.get((n, k), '')} {n}x{k}"
                table.append([shape, m, *cells[:3], str(tuple(fused[1])), *cells[3:]])
        del ws
    args.state.update(norm_configs=configs, norm_ms=cases.fused_ms(args.ms))
    title = "### add_rms_norm_linear (residual add + RMSNorm in the projection's prologue) vs add_rms_norm + the best"
    header = ["shape", "M", "unfused us", "unfused path", "fused us", "fused config", "speedup", "36 layers: us saved"]
    return rows, f"{title} unfused projection ({cases.DTYPE})\n\n" + markdown_table(header, table)
