"""The kernel micro-benchmark's sections that only time (nothing feeds the tuned table), each
`(args, timer, peak) -> (CSV rows, Markdown)`: the batch-invariant GEMM tilings and paged attention."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from engine.bench import kernel_cases as cases
from engine.bench.kernel_timing import Timer, rel_err
from engine.bench.report import markdown_table
from engine.kernels import attention, linear
from engine.kernels.tuning import SkinnyConfig


def bench_linear_invariant(args, timer: Timer, peak: float) -> tuple[list[dict], str]:
    rows, table = [], []
    tilings = [
        SkinnyConfig(16, 64, 64, 1, 4, 4),
        linear.INVARIANT_CONFIG,
        SkinnyConfig(64, 64, 64, 1, 4, 4),
        SkinnyConfig(64, 128, 64, 1, 4, 3),
    ]
    for n, k in cases.SHAPES:
        wbytes, copies, ws = cases.rotated_weights(n, k)
        for m in (1, 8, 64):
            x = torch.randn(m, k, device=cases.DEVICE).to(cases.DTYPE)
            est = wbytes / (peak * 1e3)
            cub = timer(lambda i, x=x, ws=ws: F.linear(x, ws[i]), copies, est)
            line = [f"{cases.SHAPE_NAMES[(n, k)]}", m, f"{cub:.1f}"]
            for cfg in tilings:
                fn = lambda i, x=x, ws=ws, cfg=cfg: linear.linear_with_config(x, ws[i], cfg)
                us = timer(fn, copies, est)
                rows.append(dict(N=n, K=k, M=m, config=str(tuple(cfg)), us=round(us, 2), cublas_us=round(cub, 2)))
                line.append(f"{us:.1f}")
            table.append(line)
        del ws
    header = ["shape", "M", "cuBLAS us"] + [f"{c.block_m}x{c.block_n}x{c.block_k} us" for c in tilings]
    title = f"### Batch-invariant GEMM tilings ({cases.DTYPE}, us; current: INVARIANT_CONFIG = "
    return rows, f"{title}{tuple(linear.INVARIANT_CONFIG)})\n\n" + markdown_table(header, table)


def bench_attention(args, timer: Timer, peak: float) -> tuple[list[dict], str]:
    rows, table = [], []
    splits = (1, 2, 4, 8, 16, 32)
    for batch, ctx, span in args.attn_cases:
        q, kc, vc, bt, seq_lens, qsl = cases.paged_case(batch, ctx, span, **cases.ATTN_GEOMETRY)
        kv_bytes = 2 * batch * (ctx + span) * kc.shape[2] * kc.shape[3] * kc.element_size()
        copies = max(1, min(512, math.ceil(cases.ROTATE_BYTES / kv_bytes)))
        caches = [(kc, vc)] + [(kc.clone(), vc.clone()) for _ in range(copies - 1)]
        scale = kc.shape[-1] ** -0.5
        ref = attention.paged_attention_ref(q, kc, vc, bt, seq_lens, qsl, span, scale)
        variants = [("auto", {})] + [(f"splits={s}", {"num_splits": s}) for s in splits]
        variants += [("decode_block_n=64", {"decode_block_n": 64})] if span == 1 else [("decode_block_n=64", None)]
        variants.append(("batch_invariant", {"batch_invariant": True}))
        auto_cfg = attention.attention_config(
            batch, kc.shape[2], q.shape[1] // kc.shape[2], span, bt.shape[1] * kc.shape[1], q.device, False
        )
        line = [batch, ctx, span, str(auto_cfg)]
        for name, kw in variants:
            if kw is None:
                line.append("-")
                continue

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
            row = dict(batch=batch, ctx=ctx, span=span, variant=name, us=round(us, 2), kv_GBps=round(gbps, 1))
            rows.append(row | dict(frac=round(gbps / peak, 3), rel_err=f"{err:.1e}"))
            line.append(f"{us:.1f} ({gbps / peak:.2f})")
        table.append(line)
        print(f"  attention B={batch} ctx={ctx} span={span}: {line[4:]}", flush=True)
        del caches
    header = ["batch", "ctx", "span", "auto (BQ,BM,BN,splits)", "auto us (frac)"]
    header += [f"splits={s}" for s in splits] + ["decode BLOCK_N=64", "batch_invariant"]
    title = f"### Paged attention {cases.ATTN_GEOMETRY}, {cases.DTYPE}: us (fraction of peak on K+V bytes)"
    return rows, f"{title}\n\n" + markdown_table(header, table)
