"""What one dependency between CTAs costs on this GPU: the number that decides whether a persistent
per-layer kernel can beat a chain of PDL kernels (issue 19, decode doc "What a handoff costs").

    python -m engine.bench.handoff [--out DIR] [--programs 2 132 384 660 1216] [--links 256] [--repeats 7]

Rows, each the median (min, max) of --repeats timings:
- `pdl`: --links launches of a kernel of P programs that waits (griddepcontrol.wait) and lets the
  next launch, replayed from one CUDA graph; microseconds a launch. `nopdl`: the same without PDL.
- `barrier`: one launch of P resident programs passing --links grid barriers (an arrival count in
  global memory: release add, acquire spin); microseconds a barrier, launch excluded.
- with `load` (either): after each handoff every program reads a word that program 0 wrote before
  it, the round trip a real consumer pays for its producer's data.
- `chase`: one program walking a random cycle through a buffer, one dependent load at a time
  (4 MB held in L2, and lines of a 1 GiB buffer not visited before: HBM), alone and beside programs
  of the same launch streaming 2 GiB with their loads marked evict-first (`stream alone`: their read
  bandwidth);
  nanoseconds a load, from the GPU's global timer, and each load's own time (the SM's cycle counter)
  at the 10th / 50th / 90th percentile, which tells one slower latency from a mix of L2 hits and
  misses (handoff_load.py).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from engine.bench import handoff_load
from engine.bench.handoff_load import _row
from engine.bench.report import markdown_table, write_csv
from engine.kernels._triton import bind, jit
from engine.timing import time_ms

tl = None  # triton.language, bound by _triton.bind at the first launch


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


def link_chain(word: torch.Tensor, programs: int, links: int, load: bool, pdl: bool) -> Callable[[], None]:
    """`links` back-to-back launches of the link kernel (the graph body)."""
    k = bind(globals())["_link_kernel"]
    opts = {"launch_pdl": True} if pdl else {}

    def run() -> None:
        for _ in range(links):
            k[(programs,)](word, LOAD=load, PDL=pdl, num_warps=4, **opts)

    return run


def barrier_chain(count: torch.Tensor, word: torch.Tensor, programs: int, links: int, load: bool) -> None:
    count.zero_()
    bind(globals())["_barrier_kernel"][(programs,)](count, word, links, LOAD=load, num_warps=4)


def _graph_us(run: Callable[[], None], device: torch.device, links: int, repeats: int) -> list[float]:
    """Microseconds a link: `run` (links launches) captured once in a CUDA graph, then replayed."""
    run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    return [1e3 * ms / links for ms in time_ms(graph.replay, device, repeats)]


def measure(device: torch.device, programs: Sequence[int], links: int, repeats: int) -> list[dict]:
    """Every row of the module docstring on a CUDA device."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    if max(programs) > 16 * sms:  # 16 programs of 4 warps fill an SM's 2,048 threads
        raise SystemExit(f"--programs {max(programs)}: a barrier needs every program resident (at most {16 * sms})")
    word = torch.zeros(1 + max(programs), dtype=torch.int32, device=device)
    count = torch.zeros(1, dtype=torch.int32, device=device)
    rows = []
    for p in programs:
        for load in (False, True):
            for kind in ("nopdl", "pdl"):
                us = _graph_us(link_chain(word, p, links, load, kind == "pdl"), device, links, repeats)
                rows.append(_row(kind, p, load, "us", us))
            barrier_chain(count, word, p, links, load)  # compile and warm

            def timed(n: int, p: int = p, load: bool = load) -> list[float]:  # ms a launch passing n barriers
                return time_ms(lambda: barrier_chain(count, word, p, n, load), device, repeats, warmup=0)

            base = statistics.median(timed(0))
            us = [1e3 * (t - base) / links for t in timed(links)]
            rows.append(_row("barrier", p, load, "us", us))
    return rows + handoff_load.rows(device, sms, repeats)


def report(rows: Sequence[dict]) -> str:
    head = [
        "what",
        "programs",
        "reads the producer's word",
        "per handoff or load",
        "min … max",
        "a load: p10 / p50 / p90",
    ]
    body = [
        [
            r["kind"],
            r["programs"],
            "yes" if r["load"] else "no",
            f"{r['median']:.2f} {r['unit']}",
            f"{r['min']:.2f} … {r['max']:.2f}",
            f"{r['hop_p10']:.0f} / {r['hop_p50']:.0f} / {r['hop_p90']:.0f} ns" if "hop_p50" in r else "",
        ]
        for r in rows
    ]
    return markdown_table(head, body)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="write handoff.csv and handoff.md here")
    ap.add_argument("--programs", type=int, nargs="+", default=[2, 132, 384, 660, 1216])
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
