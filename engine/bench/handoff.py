"""What one dependency between CTAs costs on this GPU: the number that decides whether a persistent
per-layer kernel can beat a chain of PDL kernels (issue 19, decode doc "What a handoff costs").

    python -m engine.bench.handoff [--out DIR] [--programs 2 132 660] [--links 256] [--repeats 7]

Rows, each the median (min, max) of --repeats timings:
- `pdl`: --links launches of a kernel of P programs that waits (griddepcontrol.wait) and lets the
  next launch, replayed from one CUDA graph; microseconds a launch. `nopdl`: the same without PDL.
- `barrier`: one launch of P resident programs passing --links grid barriers (an arrival count in
  global memory: release add, acquire spin); microseconds a barrier, launch excluded.
- with `load` (either): after each handoff every program reads a word that program 0 wrote before
  it, the round trip a real consumer pays for its producer's data.
- `chase`: one program walking a random cycle through a buffer, one dependent load at a time
  (4 MB held in L2, and lines of a 1 GiB buffer not visited before: HBM), alone and beside a kernel
  that streams 2 GiB with its loads marked evict-first (`stream alone`: its own read bandwidth);
  nanoseconds a load, from the GPU's global timer.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from engine.bench.report import markdown_table, write_csv
from engine.kernels._triton import jit

tl = None  # triton.language, bound by _triton.bind at the first launch

LINE_WORDS = 32  # int32 words in a 128-byte line: the chase visits one word a line


@jit
def _link_kernel(word_ptr, LOAD: tl.constexpr, PDL: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    if LOAD:  # every program reads what the launch before wrote; program 0 writes the next value
        v = tl.load(word_ptr)
        if tl.program_id(0) == 0:
            tl.store(word_ptr, v + 1)


@jit
def _barrier_kernel(count_ptr, word_ptr, links, LOAD: tl.constexpr):
    """links grid barriers; count_ptr must be zero at launch (all programs resident: the caller's job)."""
    programs = tl.num_programs(0)
    for i in range(links):
        if LOAD:  # noqa: SIM102 (a constexpr branch around a runtime one)
            if tl.program_id(0) == 0:
                tl.store(word_ptr, i + 1)
        tl.debug_barrier()  # this CTA's writes before its arrival (released by the add)
        seen = tl.atomic_add(count_ptr, 1, sem="release") + 1
        while seen < (i + 1) * programs:
            seen = tl.atomic_add(count_ptr, 0, sem="acquire")
        tl.debug_barrier()
        if LOAD:
            tl.store(word_ptr + 1 + tl.program_id(0), tl.load(word_ptr, volatile=True))


@jit
def _now(anchor):
    return tl.inline_asm_elementwise(
        "mov.u64 $0, %globaltimer;", "=l,r", [anchor], dtype=tl.int64, is_pure=False, pack=1
    )


@jit
def _chase_kernel(next_ptr, out_ptr, steps):
    """Walk `steps` dependent loads on from the index in out[0]; out = [where it stopped, nanoseconds]."""
    p = tl.load(out_ptr).to(tl.int32)
    t0 = _now(p)
    for _ in range(steps):
        p = tl.load(next_ptr + p, cache_modifier=".cg")
    t1 = _now(p)
    tl.store(out_ptr, p.to(tl.int64))
    tl.store(out_ptr + 1, t1 - t0)


@jit
def _stream_kernel(x_ptr, out_ptr, n, rounds, BLOCK: tl.constexpr):
    """Read x `rounds` times over a persistent grid, marked first to evict from L2 (as weights are)."""
    pid, programs = tl.program_id(0), tl.num_programs(0)
    acc = tl.zeros([BLOCK], tl.float32)
    for _ in range(rounds):
        for start in range(pid * BLOCK, n, programs * BLOCK):
            offs = start + tl.arange(0, BLOCK)
            acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0, eviction_policy="evict_first").to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc, axis=0))


def chase_cycle(lines: int, device: torch.device, seed: int = 0) -> torch.Tensor:
    """int32 [lines * LINE_WORDS]: word i * LINE_WORDS holds the word index of the next line of one
    random cycle through all `lines` lines (every hop a new 128-byte line, no pattern to prefetch)."""
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(lines, generator=g)
    nxt = torch.empty(lines, dtype=torch.int64)
    nxt[order] = torch.roll(order, -1)
    buf = torch.zeros(lines * LINE_WORDS, dtype=torch.int32)
    buf[::LINE_WORDS] = (nxt * LINE_WORDS).to(torch.int32)
    return buf.to(device)


def _kernels() -> dict:
    from engine.kernels import _triton

    return _triton.bind(globals())


def link_chain(word: torch.Tensor, programs: int, links: int, load: bool, pdl: bool) -> Callable[[], None]:
    """`links` back-to-back launches of the link kernel (the graph body)."""
    k = _kernels()["_link_kernel"]
    opts = {"launch_pdl": True} if pdl else {}

    def run() -> None:
        for _ in range(links):
            k[(programs,)](word, LOAD=load, PDL=pdl, num_warps=4, **opts)

    return run


def barrier_chain(count: torch.Tensor, word: torch.Tensor, programs: int, links: int, load: bool) -> None:
    count.zero_()
    _kernels()["_barrier_kernel"][(programs,)](count, word, links, LOAD=load, num_warps=4)


def _median_spread(xs: Sequence[float]) -> tuple[float, float, float]:
    return statistics.median(xs), min(xs), max(xs)


def _graph_us(run: Callable[[], None], links: int, repeats: int) -> list[float]:
    run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    graph.replay()
    out = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        out.append(1e3 * start.elapsed_time(end) / links)
    return out


def _event_us(fn: Callable[[], None]) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return 1e3 * start.elapsed_time(end)


def measure(device: torch.device, programs: Sequence[int], links: int, repeats: int) -> list[dict]:
    """Every row of the module docstring on a CUDA device."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    word = torch.zeros(1 + max(programs), dtype=torch.int32, device=device)
    count = torch.zeros(1, dtype=torch.int32, device=device)
    rows = []
    for p in programs:
        if p > 8 * sms:
            raise SystemExit(f"--programs {p}: a barrier needs every program resident (at most {8 * sms} here)")
        for load in (False, True):
            for kind in ("nopdl", "pdl"):
                us = _graph_us(link_chain(word, p, links, load, kind == "pdl"), links, repeats)
                rows.append(_row(kind, p, load, "us", us))
            barrier_chain(count, word, p, links, load)  # compile and warm

            def timed(n: int, p: int = p, load: bool = load) -> list[float]:
                return [_event_us(lambda: barrier_chain(count, word, p, n, load)) for _ in range(repeats)]

            base = statistics.median(timed(0))
            us = [(t - base) / links for t in timed(links)]
            rows.append(_row("barrier", p, load, "us", us))
    rows += chase_rows(device, sms, repeats)
    return rows


def chase_rows(device: torch.device, sms: int, repeats: int, steps: int = 4096) -> list[dict]:
    """The dependent-load rows, and the stream's own bandwidth (TB/s, bytes read) alone."""
    k = _kernels()
    x = torch.randn(1 << 30, dtype=torch.bfloat16, device=device)  # 2 GiB
    programs, rounds = 4 * sms, 16
    sink = torch.empty(programs, dtype=torch.float32, device=device)

    def stream() -> None:
        k["_stream_kernel"][(programs,)](x, sink, x.numel(), rounds, BLOCK=8192, num_warps=8)

    stream()
    tbs = [rounds * x.numel() * 2 / _event_us(stream) / 1e6 for _ in range(repeats)]
    rows = [_row("stream alone", programs, False, "TB/s", tbs)]
    out = torch.zeros(2, dtype=torch.int64, device=device)
    side = torch.cuda.Stream(device)
    for where, nbytes in (("L2", 4 << 20), ("HBM", 1 << 30)):
        buf = chase_cycle(nbytes // 128, device)
        out.zero_()
        for beside in (False, True):
            ns = []
            for _ in range(repeats):
                if where == "L2":  # the whole cycle into L2 first; the HBM walk goes on to lines not yet seen
                    buf.sum()
                torch.cuda.synchronize()
                if beside:  # launched first, and ~4x longer than the walk
                    side.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(side):
                        stream()
                k["_chase_kernel"][(1,)](buf, out, steps, num_warps=1)
                torch.cuda.synchronize()
                ns.append(out[1].item() / steps)
            rows.append(_row(f"chase {where}" + (" beside the stream" if beside else ""), 1, True, "ns", ns))
    return rows


def _row(kind: str, programs: int, load: bool, unit: str, xs: Sequence[float]) -> dict:
    med, lo, hi = _median_spread(xs)
    return {"kind": kind, "programs": programs, "load": load, "unit": unit, "median": med, "min": lo, "max": hi}


def report(rows: Sequence[dict]) -> str:
    head = ["what", "programs", "reads the producer's word", "per handoff or load", "min … max"]
    body = [
        [
            r["kind"],
            r["programs"],
            "yes" if r["load"] else "no",
            f"{r['median']:.2f} {r['unit']}",
            f"{r['min']:.2f} … {r['max']:.2f}",
        ]
        for r in rows
    ]
    return markdown_table(head, body)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="write handoff.csv and handoff.md here")
    ap.add_argument("--programs", type=int, nargs="+", default=[2, 132, 660])
    ap.add_argument("--links", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args(argv)
    if args.links < 1 or args.repeats < 1 or min(args.programs) < 1:
        raise SystemExit("--links, --repeats and --programs must be >= 1")
    if not torch.cuda.is_available():
        raise SystemExit("handoff times a CUDA GPU: none here")
    rows = measure(torch.device("cuda"), args.programs, args.links, args.repeats)
    table = report(rows)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        write_csv(args.out / "handoff.csv", rows)
        (args.out / "handoff.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
