"""Before / after of the decode-path kernel changes at the Qwen3-4B shapes, each op as the engine
dispatches it on this device, in one process (GPU only):

    python -m engine.bench.kernel_ab --out DIR [--ms 1 2 4 8 16 32 64]

- norm→q|k|v, norm→gate|up: add_rms_norm + the projection (before) vs `add_rms_norm_linear` (after:
  the one-pass norm prologue wherever the Triton projection runs unsplit).
- o, SwiGLU→down: the same kernels, launched plainly (before) vs with PDL (after).
- attention decode (batch x context 256): 32-key tiles (before) vs 64 where the grid needs no split.
- every Triton kernel of a layer: launched plainly (before) vs with programmatic dependent launch.

Each op is a CUDA-graph replay over rotated weight / KV copies (kernel_timing.Timer). Writes
DIR/kernel_ab.csv and prints a Markdown table: microseconds, after/before, the after path's weight
(or KV) bytes over time as a fraction of the measured copy bandwidth.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch

from engine.bench import kernel_cases as cases
from engine.bench.hw import copy_bandwidth
from engine.bench.kernel_timing import Timer, rel_err
from engine.bench.report import markdown_table, write_csv
from engine.kernels import _triton, attention, fused_linear, linear, norm

log = logging.getLogger(__name__)
EPS = 1e-6
ATTN_CTX = 256


@contextmanager
def before() -> Iterator[None]:
    """The previous dispatch: no norm prologue, 32-key decode tiles, no PDL."""
    saved = attention.DECODE_WIDE_BLOCK_N, fused_linear.add_rms_norm_linear_config, _triton.PDL
    attention.DECODE_WIDE_BLOCK_N, _triton.PDL = attention.DECODE_BLOCK_N, False
    fused_linear.add_rms_norm_linear_config = lambda *a, **k: None
    try:
        yield
    finally:
        attention.DECODE_WIDE_BLOCK_N, fused_linear.add_rms_norm_linear_config, _triton.PDL = saved


def norm_case(n: int, k: int, m: int):
    nbytes, copies, ws = cases.rotated_weights(n, k)
    x, r = (
        torch.randn(m, k, device=cases.DEVICE).to(cases.DTYPE),
        torch.randn(m, k, device=cases.DEVICE).to(cases.DTYPE),
    )
    nw = torch.rand(k, device=cases.DEVICE).add_(0.5).to(cases.DTYPE)
    fn = lambda i: fused_linear.add_rms_norm_linear(x, r, nw, EPS, ws[i])[0]  # noqa: E731
    ref = torch.nn.functional.linear(norm.add_rms_norm_ref(x.float(), r.float(), nw.float(), EPS)[0], ws[0].float())
    return nbytes, copies, fn, ref


def proj_case(n: int, k: int, m: int, swiglu: bool):
    nbytes, copies, ws = cases.rotated_weights(n, k)
    x = torch.randn(m, 2 * k if swiglu else k, device=cases.DEVICE).to(cases.DTYPE)
    if swiglu:
        fn = lambda i: fused_linear.silu_mul_linear(x, ws[i])  # noqa: E731
        ref = fused_linear.silu_mul_linear_ref(x.float(), ws[0].float())
    else:
        fn = lambda i: linear.linear(x, ws[i])  # noqa: E731
        ref = linear.linear_ref(x.float(), ws[0].float())
    return nbytes, copies, fn, ref


def attention_case(batch: int, ctx: int):
    q, kc, vc, bt, seq_lens, qsl = cases.paged_case(batch, ctx, 1, **cases.ATTN_GEOMETRY)
    kv_bytes = 2 * kc.numel() * kc.element_size()
    copies = max(1, min(8, -(-cases.ROTATE_BYTES // kv_bytes)))
    caches = [(kc, vc)] + [(kc.clone(), vc.clone()) for _ in range(copies - 1)]
    scale = cases.ATTN_GEOMETRY["d"] ** -0.5
    fn = lambda i: attention.paged_attention(q, *caches[i], bt, seq_lens, qsl, 1, scale, True)  # noqa: E731
    ref = attention.paged_attention_ref(q, kc, vc, bt, seq_lens, qsl, 1, scale)
    return kv_bytes, copies, fn, ref


def measure(label: str, m: int, case, timer: Timer, bw_gbps: float) -> dict:
    nbytes, copies, fn, ref = case
    row: dict = {"op": label, "M": m}
    for side in ("before", "after"):
        with before() if side == "before" else nullcontext():
            err = rel_err(fn(0), ref)
            if not err < 2e-2:
                raise RuntimeError(f"{label} M={m} {side}: rel err {err:.2e}")
            row[f"{side}_us"] = timer(fn, copies, nbytes / (bw_gbps * 1e3))
    row["after_over_before"] = row["after_us"] / row["before_us"]
    row["after_bw_fraction"] = nbytes / (row["after_us"] * 1e-6) / 1e9 / bw_gbps
    return row


def cases_for(ms: Sequence[int]) -> Iterator[tuple[str, int, Callable[[], tuple]]]:
    (qkv_n, h), (_, q_size), (gu_n, _), (_, inter) = cases.SHAPES[:4]
    for m in ms:
        yield "norm→q|k|v", m, lambda m=m: norm_case(qkv_n, h, m)
        yield "norm→gate|up", m, lambda m=m: norm_case(gu_n, h, m)
        yield "o", m, lambda m=m: proj_case(h, q_size, m, False)
        yield "SwiGLU→down", m, lambda m=m: proj_case(h, inter, m, True)
    for b in (1, 8, 64):
        yield f"attention ctx {ATTN_CTX}", b, lambda b=b: attention_case(b, ATTN_CTX)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine.bench.kernel_ab", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--ms", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    args = p.parse_args(argv)
    if min(args.ms) < 1:
        raise SystemExit("--ms: row counts >= 1")
    if not torch.cuda.is_available():
        raise SystemExit("kernel_ab needs a CUDA device")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    bw, timer, rows = copy_bandwidth(torch.device("cuda")) / 1e9, Timer("graph"), []  # GB/s
    for label, m, build in cases_for(args.ms):
        try:
            rows.append(measure(label, m, build(), timer, bw))
        except Exception as e:  # one failing op is reported; the others still run
            log.warning("%s M=%d failed: %s", label, m, str(e).splitlines()[0][:200] if str(e) else type(e).__name__)
        torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "kernel_ab.csv", rows)
    table = [
        [
            r["op"],
            r["M"],
            f"{r['before_us']:.1f}",
            f"{r['after_us']:.1f}",
            f"{r['after_over_before']:.2f}",
            f"{100 * r['after_bw_fraction']:.0f} %",
        ]
        for r in rows
    ]
    header = ["op", "M (attention: batch)", "before µs", "after µs", "after/before", "after: of copy BW"]
    print(f"copy bandwidth {bw:.0f} GB/s\n\n" + markdown_table(header, table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
