"""The dependent-load rows of engine.bench.handoff: one program walking a random cycle of lines (held
in L2, or not yet visited: HBM) and one decode row's attention half, each alone and beside a kernel
streaming 2 GiB at the read bandwidth with its loads marked evict-first, as a weight stream would be."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

import torch

from engine.kernels._triton import jit

tl = None  # triton.language, bound by _triton.bind at the first launch

LINE_WORDS = 32  # int32 words in a 128-byte line: the walk visits one word a line


@jit
def _now(anchor):
    return tl.inline_asm_elementwise(
        "mov.u64 $0, %globaltimer;", "=l,r", [anchor], dtype=tl.int64, is_pure=False, pack=1
    )


@jit
def _chase_kernel(next_ptr, out_ptr, steps):
    """Walk `steps` dependent loads on from the index in out[0]; out = [where it stopped, nanoseconds,
    start, end] (the global timer's)."""
    p = tl.load(out_ptr).to(tl.int32)
    t0 = _now(p)
    for _ in range(steps):
        p = tl.load(next_ptr + p, cache_modifier=".cg")
    t1 = _now(p)
    tl.store(out_ptr, p.to(tl.int64))
    tl.store(out_ptr + 1, t1 - t0)
    tl.store(out_ptr + 2, t0)
    tl.store(out_ptr + 3, t1)


@jit
def _stream_kernel(x_ptr, out_ptr, stamp_ptr, n, rounds, BLOCK: tl.constexpr):
    """Read x `rounds` times over a persistent grid, marked first to evict from L2 (as weights are);
    program 0 stamps its start and end (the global timer) into stamp[0:2]."""
    pid, programs = tl.program_id(0), tl.num_programs(0)
    if pid == 0:
        tl.store(stamp_ptr, _now(pid))
    acc = tl.zeros([BLOCK], tl.float32)
    for _ in range(rounds):
        for start in range(pid * BLOCK, n, programs * BLOCK):
            offs = start + tl.arange(0, BLOCK)
            acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0, eviction_policy="evict_first").to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc, axis=0))
    if pid == 0:
        tl.store(stamp_ptr + 1, _now(pid))


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


def rows(device: torch.device, sms: int, repeats: int, steps: int = 4096) -> list[dict]:
    """The dependent-load rows and the attention half's, alone and beside the stream, and the stream's
    own read bandwidth (TB/s, 2 programs an SM). `inside`: the repeats whose walk lay wholly inside the
    stream's span."""
    from engine.kernels import _triton

    k = _triton.bind(globals())
    x = torch.randn(1 << 30, dtype=torch.bfloat16, device=device)  # 2 GiB
    programs, rounds = 2 * sms, 16  # room left on every SM for the walk's and the attention's programs
    sink = torch.empty(programs, dtype=torch.float32, device=device)
    stamp = torch.zeros(2, dtype=torch.int64, device=device)

    def stream() -> None:
        k["_stream_kernel"][(programs,)](x, sink, stamp, x.numel(), rounds, BLOCK=8192, num_warps=4)

    stream()
    tbs = [rounds * x.numel() * 2 / _event_us(stream) / 1e6 for _ in range(repeats)]
    table = [_row("stream alone", programs, False, "TB/s", tbs)]
    out = torch.zeros(4, dtype=torch.int64, device=device)
    side = torch.cuda.Stream(device)

    def run(fn: Callable[[], None], beside: bool) -> None:
        torch.cuda.synchronize()
        if beside:  # the stream first, on its own CUDA stream: ~4x longer than the walk
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                stream()
        fn()
        torch.cuda.synchronize()

    for where, nbytes in (("L2", 4 << 20), ("HBM", 1 << 30)):
        buf = chase_cycle(nbytes // 128, device)
        out.zero_()
        for beside in (False, True):
            ns, inside = [], 0
            for _ in range(repeats):
                if where == "L2":  # the whole cycle into L2 first; the HBM walk goes on to lines not yet seen
                    buf.sum()
                run(lambda buf=buf: k["_chase_kernel"][(1,)](buf, out, steps, num_warps=1), beside)
                _, t, t0, t1 = out.tolist()
                ns.append(t / steps)
                s0, s1 = stamp.tolist()
                inside += beside and s0 <= t0 and t1 <= s1
            table.append(_row(f"chase {where}" + (" beside the stream" if beside else ""), 1, True, "ns", ns, inside))
    return table + attention_half_rows(run, repeats)


def attention_half_rows(run: Callable[[Callable[[], None], bool], None], repeats: int) -> list[dict]:
    """QK-norm + RoPE + store, then the split attention and its reduce, one row at ctx 256, as dispatched
    (kernel_ab's case): microseconds a call over a graph of 32 calls, alone and beside the stream."""
    from engine.bench.kernel_ab_cases import rope_attention_case

    _, copies, fn, _, _ = rope_attention_case(1, 256)
    calls = 32
    graph = torch.cuda.CUDAGraph()
    fn(0)
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i % copies)
    table = []
    for beside in (False, True):
        us = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

            def timed(start=start, end=end) -> None:
                start.record()
                graph.replay()
                end.record()

            run(timed, beside)
            us.append(1e3 * start.elapsed_time(end) / calls)
        table.append(_row("attention half, 1 row" + (" beside the stream" if beside else ""), 1, True, "us", us))
    return table


def _event_us(fn: Callable[[], None]) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return 1e3 * start.elapsed_time(end)


def _median_spread(xs: Sequence[float]) -> tuple[float, float, float]:
    return statistics.median(xs), min(xs), max(xs)


def _row(kind: str, programs: int, load: bool, unit: str, xs: Sequence[float], inside: int | None = None) -> dict:
    med, lo, hi = _median_spread(xs)
    row = {"kind": kind, "programs": programs, "load": load, "unit": unit, "median": med, "min": lo, "max": hi}
    return row | {"inside": "" if inside is None else inside}
