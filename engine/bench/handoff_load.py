"""The dependent-load rows of engine.bench.handoff: one program walking a random cycle of lines (held
in L2, or not yet visited: HBM), alone and beside programs of the same launch that stream 2 GiB at
the read bandwidth with their loads marked evict-first, as a weight stream is. One launch, so the two
run together: two kernels on two CUDA streams ran one after the other on the H200 machine."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import torch

from engine.kernels._triton import bind, jit
from engine.timing import time_ms

tl = None  # triton.language, bound by _triton.bind at the first launch

LINE_WORDS = 32  # int32 words in a 128-byte line: the walk visits one word a line


@jit
def _now(anchor):
    return tl.inline_asm_elementwise(
        "mov.u64 $0, %globaltimer;", "=l,r", [anchor], dtype=tl.int64, is_pure=False, pack=1
    )


@jit
def _cycles(anchor):
    """The SM's cycle counter, read once `anchor` is there (so after the load that made it)."""
    return tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [anchor], dtype=tl.int64, is_pure=False, pack=1)


@jit
def _walk_kernel(
    next_ptr, out_ptr, hops_ptr, x_ptr, sink_ptr, n, rounds, steps, BLOCK: tl.constexpr, UNROLL: tl.constexpr
):
    """Program 0 walks `steps` dependent loads on from the index in out[0] (out = [where it stopped,
    nanoseconds by the global timer]; hops[i]: SM cycles of load i); the other programs, all resident
    in the same launch, read x `rounds` times meanwhile, UNROLL blocks of BLOCK in flight at a time,
    marked first to evict from L2 (as weights are)."""
    pid = tl.program_id(0)
    if pid == 0:
        p = tl.load(out_ptr).to(tl.int32)
        t0 = _now(p)
        c0 = _cycles(p)
        for i in range(steps):
            p = tl.load(next_ptr + p, cache_modifier=".cg")
            c1 = _cycles(p)
            tl.store(hops_ptr + i, c1 - c0)
            c0 = c1
        t1 = _now(p)
        tl.store(out_ptr, p.to(tl.int64))
        tl.store(out_ptr + 1, t1 - t0)
    else:
        streams = tl.num_programs(0) - 1
        acc = tl.zeros([BLOCK], tl.float32)
        tile = tl.arange(0, UNROLL)[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
        for _ in range(rounds):
            for start in range((pid - 1) * BLOCK * UNROLL, n, streams * BLOCK * UNROLL):
                offs = start + tile
                x = tl.load(x_ptr + offs, mask=offs < n, other=0.0, eviction_policy="evict_first")
                acc += tl.sum(x.to(tl.float32), axis=0)
        tl.store(sink_ptr + pid, tl.sum(acc, axis=0))


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
    """The walk's rows, alone and beside the stream in the same launch (4 programs an SM), and the
    stream's own read bandwidth (TB/s, the walk idle) there and on 48, 66 and one program an SM:
    what a grid of whole-head q|k|v programs (48 of 128 rows) could stream."""
    k = bind(globals())["_walk_kernel"]
    x = torch.randn(1 << 30, dtype=torch.bfloat16, device=device)  # 2 GiB
    programs = 4 * sms
    sink = torch.empty(programs, dtype=torch.float32, device=device)
    out = torch.zeros(2, dtype=torch.int64, device=device)
    hops = torch.zeros(steps, dtype=torch.int64, device=device)

    def launch(buf: torch.Tensor, walk: int, rounds: int, grid: int, warps: int = 4) -> None:
        unroll = 1 if warps == 4 else 8  # 16 warps: 8 blocks of 16 KB in flight a program
        k[(grid,)](buf, out, hops, x, sink, x.numel(), rounds, walk, BLOCK=8192, UNROLL=unroll, num_warps=warps)

    idle = torch.zeros(LINE_WORDS, dtype=torch.int32, device=device)  # a walk of no steps
    table = []
    # the stream alone: the walk's companion (4 programs an SM), then on fewer SMs, 16 warps a program
    for streams, warps in ((programs - 1, 4), (48, 16), (66, 16), (sms, 16)):
        ms = time_ms(lambda s=streams, w=warps: launch(idle, 0, 2, s + 1, w), device, repeats)
        tbs = [4 * x.numel() / t / 1e9 for t in ms]  # two rounds of 2-byte elements
        table.append(_row(f"stream alone, {warps} warps a program", streams, False, "TB/s", tbs))
    for where, nbytes in (("L2", 4 << 20), ("HBM", 1 << 30)):
        buf = chase_cycle(nbytes // 128, device)
        out.zero_()
        for beside in (False, True):
            ns, per_hop = [], []
            for _ in range(repeats):
                if where == "L2":  # the whole cycle into L2 first; the HBM walk goes on to lines not yet seen
                    buf.sum()
                launch(buf, steps, 4, programs if beside else 1)  # 4 rounds: ~4 ms, longer than the walk
                ns.append(out[1].item() / steps)
                cycles = hops.double().cpu()
                per_hop.append(cycles * (out[1].item() / cycles.sum().item()))  # cycles to ns, this walk's rate
            row = _row(f"chase {where}" + (" beside the stream" if beside else ""), 1, True, "ns", ns)
            table.append(row | hop_quantiles(torch.cat(per_hop)))
    return table


def hop_quantiles(ns: torch.Tensor) -> dict:
    """Per-load ns at the 10th, 50th and 90th percentile: one latency shifted, or two mixed (some lines
    from L2, some from HBM), tell apart there."""
    q = torch.quantile(ns.double(), torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)).tolist()
    return {"hop_p10": q[0], "hop_p50": q[1], "hop_p90": q[2]}


def _median_spread(xs: Sequence[float]) -> tuple[float, float, float]:
    return statistics.median(xs), min(xs), max(xs)


def _row(kind: str, programs: int, load: bool, unit: str, xs: Sequence[float]) -> dict:
    med, lo, hi = _median_spread(xs)
    return {"kind": kind, "programs": programs, "load": load, "unit": unit, "median": med, "min": lo, "max": hi}
