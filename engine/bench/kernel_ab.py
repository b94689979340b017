"""Before / after of the decode-path kernel changes at the Qwen3-4B shapes, each op as the engine
dispatches it on this device, in one process (GPU only):

    python -m engine.bench.kernel_ab --out DIR [--ms 1 8 16 64]

(end to end, both dispatches interleaved in one decode run: engine/bench/decode_ab.py)

"before" is the previous dispatch of the row's op ("after" the current one), switched per row:
- the two pairs the split-K deferral joins (before = o's and SwiGLU->down's partials summed by their
  reduce kernel, `reduce_kernel`; after = at one row the partials go to the next add + RMSNorm
  prologue, gemm.DEFER_MAX_ROWS), at every --ms row count: o -> norm->gate|up and SwiGLU->down ->
  norm->q|k|v (the layer's second and first halves' projections);
- o and SwiGLU->down alone at every --ms row count, norm->q|k|v and norm->gate|up at one row (both
  sides run the same kernels: the per-op times of the step);
- one-row candidates of the early-weights GEMV for each of the four ("o [config]", run on it even
  where the dispatch does not take it): the data to retune the table's one-row entries (after = that
  config, before = the previous dispatch);
- the decode attention after its QK-norm + RoPE + KV store ("rope → attention", ctx 256 and 2048) at
  every --ms row count: before = the wait first, after = the first key tile pulled into L2 before the
  PDL wait (attention.EARLY_KV), `wait_first_attention`;
- gate|up then SwiGLU at 2-64 of the --ms row counts ("gate|up → SwiGLU"): before = gate|up, then
  silu_and_mul, after = SwiGLU in gate|up's epilogue at half its tile (mlp.GLU_MAX_ROWS),
  `unfused_mlp`; beside them the epilogue at other tilings ("gate|up → SwiGLU [config]") for a retune;
- the projections at one row and 8-64 of the --ms row counts on the TMA GEMM ("tma: q|k|v", "tma: gate|up →
  SwiGLU" with the epilogue, ...): before = as dispatched with the tl.dot kernel's cp.async loads in
  place of TMA (gemm.TMA False; cuBLAS stays cuBLAS), after = as dispatched, and at each tiling of
  TMA_TILES with tma=1 ("tma: o [config]"): the data for its table entries;
- o and SwiGLU->down at one row at each of PAIR_CANDIDATES, timed with the projection after them ("pair:
  o [config] → norm→gate|up"): before = the pair as dispatched; `--pair-table FILE` writes the shipped
  table with the configs that beat it (an A/B arm);
- the fused tl.dot path at 2-16 of the --ms row counts ("prefetch: norm→q|k|v [config]"): before =
  its prologue reading each tile in its own K step, after = a step ahead (gemm.PROLOGUE_PREFETCH),
  at a few configs per projection; beside them the unfused pairs as dispatched ("norm→q|k|v" at
  that M, "SwiGLU→down"): the data to give the fused kernels the 2-16-row table entries.

Each op is a CUDA-graph replay over rotated weight copies (kernel_timing.Timer), with PDL as the
engine launches it (cases: kernel_ab_cases.py; candidate configs: kernel_ab_configs.py). Writes
DIR/kernel_ab.csv and prints a Markdown table: microseconds, after/before, the after path's bytes
over time as a fraction of the measured copy bandwidth.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import torch

from engine.bench import kernel_cases as cases
from engine.bench.hw import copy_bandwidth
from engine.bench.kernel_ab_cases import (
    fused_case,
    glu_case,
    norm_case,
    pair_case,
    proj_case,
    rope_attention_case,
    setting,
    tma_case,
)
from engine.bench.kernel_ab_configs import (
    CANDIDATES,
    GLU_CANDIDATES,
    NORM_CANDIDATES,
    PAIR_CANDIDATES,
    PREFETCH_NORM,
    PREFETCH_SWIGLU,
    tma_configs,
)
from engine.bench.kernel_fused import FUSED_OPS, PAIR_OPS, Winners, fused_winners, pair_winners, with_fused
from engine.bench.kernel_timing import Timer, rel_err
from engine.bench.report import markdown_table, write_csv
from engine.kernels import attention, gemm, mlp, tuning
from engine.kernels.tuning import TunedTables

log = logging.getLogger(__name__)


def reduce_kernel() -> AbstractContextManager:
    """The dispatch before the deferral: o's and down's split-K partials summed by their reduce
    kernel at every row count."""
    return setting(gemm, "DEFER_MAX_ROWS", 0)


def in_step_prologue() -> AbstractContextManager:
    """The tl.dot path's prologue reading each tile in its own K step (before PROLOGUE_PREFETCH)."""
    return setting(gemm, "PROLOGUE_PREFETCH", False)


def wait_first_attention() -> AbstractContextManager:
    """The decode attention waiting for the kernel before it first (before attention.EARLY_KV)."""
    return setting(attention, "EARLY_KV", False)


def unfused_mlp() -> AbstractContextManager:
    """gate|up, then silu_and_mul at every row count (before mlp.GLU_MAX_ROWS)."""
    return setting(mlp, "GLU_MAX_ROWS", 0)


def read_tables(path: Path) -> TunedTables:
    """A tuned table file (a `python -m engine.bench.kernels` run's DIR/tuned/<device>.json) for a
    retune's A/B arm; ValueError naming the file if it is missing or not a tuned table (unlike the
    shipped file's loader, which falls back: an A/B against the wrong table measures nothing)."""
    try:
        return tuning.parse(json.loads(path.read_text()), str(path))
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: {err}") from None


def tma_off() -> AbstractContextManager:
    """The tl.dot kernel's cp.async loads for every config, tma=1 ones too (before gemm.TMA)."""
    return setting(gemm, "TMA", False)


def switch_for(label: str) -> Callable[[], AbstractContextManager]:
    """The row's way back to the previous dispatch."""
    if label.startswith("pair:"):
        return nullcontext  # the pair as dispatched: only the config differs
    if label.startswith("tma:"):
        return tma_off
    if label.startswith("prefetch:"):
        return in_step_prologue
    if label.startswith("gate|up → SwiGLU"):
        return unfused_mlp
    return wait_first_attention if label.startswith("rope → attention") else reduce_kernel


def measure(label: str, m: int, case, timer: Timer, bw_gbps: float) -> dict:
    nbytes, copies, fn, ref, after_fn = case
    row: dict = {"op": label, "M": m}
    for side in ("before", "after"):
        with switch_for(label)() if side == "before" else nullcontext():
            fn = fn if side == "before" else after_fn
            err = rel_err(fn(0), ref)
            if not err < 2e-2:
                raise RuntimeError(f"{label} M={m} {side}: rel err {err:.2e}")
            row[f"{side}_us"] = timer(fn, copies, nbytes / (bw_gbps * 1e3))
    row["after_over_before"] = row["after_us"] / row["before_us"]
    row["after_bw_fraction"] = nbytes / (row["after_us"] * 1e-6) / 1e9 / bw_gbps
    return row


def cases_for(ms: Sequence[int], only: str = "") -> Iterator[tuple[str, int, Callable[[], tuple]]]:
    """Every row at these row counts, or those whose op starts with `only`."""
    return (case for case in _all_cases(ms) if case[0].startswith(only))


def _all_cases(ms: Sequence[int]) -> Iterator[tuple[str, int, Callable[[], tuple]]]:
    (qkv_n, h), (_, q_size), (gu_n, _), (_, inter), (vocab, _) = cases.SHAPES[:5]
    for m in ms:
        yield "o → norm→gate|up", m, lambda m=m: pair_case((h, q_size), gu_n, False, m)
        yield "SwiGLU→down → norm→q|k|v", m, lambda m=m: pair_case((h, inter), qkv_n, True, m)
    for m in ms:
        for ctx in (256, 2048):
            yield f"rope → attention, ctx {ctx}", m, lambda m=m, ctx=ctx: rope_attention_case(m, ctx)
    yield "norm→q|k|v", 1, lambda: norm_case(qkv_n, h, 1)
    yield "norm→gate|up", 1, lambda: norm_case(gu_n, h, 1)
    for m in ms:
        yield "o", m, lambda m=m: proj_case(h, q_size, m, False)
        yield "SwiGLU→down", m, lambda m=m: proj_case(h, inter, m, True)
    for cfg in CANDIDATES:
        yield f"o {list(cfg)}", 1, lambda cfg=cfg: proj_case(h, q_size, 1, False, cfg)
        yield f"SwiGLU→down {list(cfg)}", 1, lambda cfg=cfg: proj_case(h, inter, 1, True, cfg)
    for cfg in NORM_CANDIDATES:
        yield f"norm→q|k|v {list(cfg)}", 1, lambda cfg=cfg: norm_case(qkv_n, h, 1, cfg)
        yield f"norm→gate|up {list(cfg)}", 1, lambda cfg=cfg: norm_case(gu_n, h, 1, cfg)
    for m in (m for m in ms if 2 <= m <= 64):
        yield "gate|up → SwiGLU", m, lambda m=m: glu_case(gu_n, h, m)
        for cfg in (c for c in GLU_CANDIDATES if (c.block_m == 16) == (m <= 16)):
            yield f"gate|up → SwiGLU {list(cfg)}", m, lambda m=m, cfg=cfg: glu_case(gu_n, h, m, cfg)
    for m in (m for m in ms if m == 1 or 8 <= m <= 64):
        for name, (n, k), glu in (
            ("q|k|v", (qkv_n, h), False),
            ("o", (h, q_size), False),
            ("down", (h, inter), False),
            ("gate|up → SwiGLU", (gu_n, h), True),
            ("lm_head", (vocab, h), False),
        ):
            yield f"tma: {name}", m, lambda m=m, n=n, k=k, glu=glu: tma_case(n, k, m, glu)
            for cfg in tma_configs(m, glu):
                yield f"tma: {name} {list(cfg)}", m, lambda m=m, n=n, k=k, glu=glu, cfg=cfg: tma_case(n, k, m, glu, cfg)
    if 1 in ms:
        for cfg in PAIR_CANDIDATES:
            yield f"pair: o {list(cfg)} → norm→gate|up", 1, lambda cfg=cfg: pair_case((h, q_size), gu_n, False, 1, cfg)
            down = f"pair: SwiGLU→down {list(cfg)} → norm→q|k|v"
            yield down, 1, lambda cfg=cfg: pair_case((h, inter), qkv_n, True, 1, cfg)
    for m in (m for m in ms if 2 <= m <= 16):
        yield "norm→q|k|v", m, lambda m=m: norm_case(qkv_n, h, m)
        yield "norm→gate|up", m, lambda m=m: norm_case(gu_n, h, m)
        for cfg in PREFETCH_NORM:
            yield f"prefetch: norm→q|k|v {list(cfg)}", m, lambda m=m, cfg=cfg: fused_case(qkv_n, h, m, False, cfg)
            yield f"prefetch: norm→gate|up {list(cfg)}", m, lambda m=m, cfg=cfg: fused_case(gu_n, h, m, False, cfg)
        for cfg in PREFETCH_SWIGLU:
            yield f"prefetch: SwiGLU→down {list(cfg)}", m, lambda m=m, cfg=cfg: fused_case(h, inter, m, True, cfg)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine.bench.kernel_ab", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--ms", type=int, nargs="+", default=[1, 8, 16, 64])
    p.add_argument("--only", default="", metavar="PREFIX", help="the rows whose op starts with PREFIX (e.g. prefetch:)")
    p.add_argument(
        "--fused-table",
        type=Path,
        help="write the shipped table plus the prefetched fused configs that beat their unfused pair (an A/B arm)",
    )
    p.add_argument(
        "--pair-table",
        type=Path,
        help="write the shipped table with o's and down's one-row configs that beat their dispatched pair (an A/B arm)",
    )
    args = p.parse_args(argv)
    if min(args.ms) < 1:
        raise SystemExit("--ms: row counts >= 1")
    if not any(cases_for(args.ms, args.only)):
        raise SystemExit(f"--only: no row's op starts with {args.only!r} at --ms {args.ms}")
    for flag, path in (("--fused-table", args.fused_table), ("--pair-table", args.pair_table)):
        if path is not None and path.is_dir():
            raise SystemExit(f"{flag}: {path} is a folder; give the table file's path")
    if not torch.cuda.is_available():
        raise SystemExit("kernel_ab needs a CUDA device")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    bw, timer, rows = copy_bandwidth(torch.device("cuda")) / 1e9, Timer("graph"), []  # GB/s
    for label, m, build in cases_for(args.ms, args.only):
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
    header = ["op", "M", "before µs", "after µs", "after/before", "after: of copy BW"]
    print(f"copy bandwidth {bw:.0f} GB/s\n\n" + markdown_table(header, table))
    if args.fused_table:
        write_table(args.fused_table, fused_winners(rows), FUSED_OPS, "fused", "the unfused pair")
    if args.pair_table:
        write_table(args.pair_table, pair_winners(rows), PAIR_OPS, "pair", "the pair as dispatched")
    return 0


def write_table(path: Path, winners: Winners, ops: dict, kind: str, base: str) -> None:
    """The shipped table with the winners' entries (with_fused), for a decode A/B arm."""
    for (op, m), (cfg, ratio) in sorted(winners.items()):
        print(f"{kind} {op} M={m}: {list(cfg)} at {ratio:.3f} of {base}")
    name = torch.cuda.get_device_name()
    shipped = tuning.tables_for(torch.device("cuda"))
    note = f"kernel_ab --{kind}-table: the shipped table + {len(winners)} {kind} entries"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tuning.dumps(with_fused(shipped, winners, ops), name, note))


if __name__ == "__main__":
    raise SystemExit(main())
