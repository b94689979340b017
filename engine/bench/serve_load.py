"""Open-loop serving load: one server per lever arm, Poisson arrivals at each rate,
arms interleaved (rotated each repeat, the same arrivals and prompts for every arm of a repeat);
throughput, TTFT, inter-chunk latency and TPOT per arm, plus τ from each server's /metrics.

python -m engine.bench serve-load --target DIR --drafter DIR --rates 2 8 32 --arms plain spec --out DIR
python -m engine.bench serve-load --geometry 4b --profile code --rates 8 64 --max-tokens 64 --out DIR"""

from __future__ import annotations

import argparse
import http.client
import logging
import math
import re
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from engine.bench.arms import Arm, parse_arms
from engine.bench.common import add_device_args, add_weight_args, resolve_device, setup_logging
from engine.bench.meta import meta_lines, run_meta
from engine.bench.open_loop import arrival_times, run_open_loop
from engine.bench.report import write_csv, write_json
from engine.bench.serve_stats import markdown, run_row, summarize
from engine.bench.serve_workload import Command, file_workload, known_workload
from engine.fixture.known.geometry import GEOMETRIES

log = logging.getLogger(__name__)
_METRIC = re.compile(rb"^pegaspec_(\w+) (\S+)$", re.MULTILINE)
SPEC_COUNTERS = ("rounds", "gated_rounds", "committed_tokens", "launched_ahead", "launched_ahead_used")  # /metrics


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(base: list[str], port: int, args: argparse.Namespace) -> list[str]:
    """An arm's server command (`base`) with the settings every arm shares."""
    cmd = base + ["--port", str(port), "--served-model-name", "bench", "--max-num-seqs", str(args.max_num_seqs)]
    cmd += ["--max-model-len", str(args.max_model_len), "--device", args.device, "--dtype", args.dtype]
    return cmd + ["--backend", args.backend] + (["--no-cuda-graphs"] if args.no_cuda_graphs else [])


@dataclass
class Server:
    arm: Arm
    url: str
    process: subprocess.Popen
    log_path: Path

    def get(self, path: str, timeout_s: float = 10.0) -> tuple[int, bytes]:
        host, port = self.url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=timeout_s)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def counters(self) -> dict[str, float]:
        _, body = self.get("/metrics")
        found = {m.group(1).decode(): float(m.group(2)) for m in _METRIC.finditer(body)}
        return {k: found.get(f"{k}_total", 0.0) for k in SPEC_COUNTERS}

    def wait_ready(self, limit_s: float) -> None:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-3000:]
                raise SystemExit(f"server for arm {self.arm.label} exited ({self.process.returncode}):\n{tail}")
            try:
                if self.get("/health", 2.0)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise SystemExit(f"server for arm {self.arm.label} not healthy after {limit_s:.0f} s; see {self.log_path}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_servers(arms: Sequence[Arm], command_of: Command, args: argparse.Namespace) -> list[Server]:
    """All at once (imports, weights and start-up overlap; each sizes its KV for max_num_seqs x
    max_model_len, a small share of the card), then each waited for until healthy."""
    servers: list[Server] = []
    try:
        for arm in arms:
            port = free_port()
            log_path = args.out / f"server-{re.sub(r'[^A-Za-z0-9]+', '_', arm.label)}.log"
            with log_path.open("w") as sink:
                cmd = server_command(command_of(arm), port, args)
                proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT)
            servers.append(Server(arm, f"http://127.0.0.1:{port}", proc, log_path))
        start = time.monotonic()
        for server in servers:
            server.wait_ready(args.start_timeout_s - (time.monotonic() - start))
            since = time.monotonic() - start
            log.info("arm %s: serving on %s (%.1f s after launch)", server.arm.label, server.url, since)
    except BaseException:
        for s in servers:
            s.stop()
        raise
    return servers


def run_load(
    servers: Sequence[Server], prompts: list[list[int]], args: argparse.Namespace, report: Callable[[list[dict]], None]
) -> list[dict]:
    """Every (rate, repeat, arm) run; `report` gets the rows so far after each run (a capped run keeps them)."""
    warmup = arrival_times(max(args.rates), args.warmup_requests, seed=-1)
    for s in servers:  # at the top rate: the batch ramps through its graph buckets (captures, compiles)
        t0 = time.perf_counter()
        run_open_loop(s.url, "bench", prompts, warmup, args.max_tokens)
        log.info("arm %s: warm-up %.1f s", s.arm.label, time.perf_counter() - t0)
    rows = []
    for rate in args.rates:
        count = max(args.min_requests, math.ceil(rate * args.duration_s))
        for repeat in range(args.repeats):
            offsets = arrival_times(rate, count, seed=1000 * repeat + round(rate * 1000))
            first = repeat % len(servers)
            for s in [*servers[first:], *servers[:first]]:
                before = s.counters()
                records, wall = run_open_loop(s.url, "bench", prompts, offsets, args.max_tokens)
                spec = {k: v - before[k] for k, v in s.counters().items()}
                rows.append(run_row(rate, repeat, s.arm.label, records, wall, spec))
                r = rows[-1]
                tok_s, label = r["output_tok_s"] or 0, s.arm.label
                log.info("rate %g repeat %d %s: %.1f tok/s, %d errors", rate, repeat, label, tok_s, r["errors"])
                report(rows)
    return rows


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine.bench serve-load", description=__doc__.split("\n\n")[0])
    add_weight_args(p)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--rates", type=float, nargs="+", default=[2.0, 8.0, 32.0], help="arrival rates (requests/s)")
    p.add_argument("--arms", nargs="+", default=["plain", "spec"], help="plain, spec, spec+trim=K, spec+gate=N")
    p.add_argument("--repeats", type=int, default=2, help="runs per (rate, arm), arm order rotated each time")
    p.add_argument("--duration-s", type=float, default=20.0, help="arrivals span about this long per run")
    p.add_argument("--min-requests", type=int, default=16, help="at least this many requests per run")
    p.add_argument("--warmup-requests", type=int, default=8, help="per server, at the highest rate, unmeasured")
    p.add_argument("--max-tokens", type=int, default=128, help="output tokens per request (EOS ignored)")
    p.add_argument("--max-prompt-len", type=int, default=None, help="keep the first N tokens of each prompt")
    p.add_argument("--max-num-seqs", type=int, default=64, help="each server's batch limit")
    p.add_argument("--start-timeout-s", type=float, default=900.0, help="how long a server may take to start")
    known = p.add_argument_group("or the bench-only known-continuation pair, built in memory by each server")
    known.add_argument("--geometry", choices=GEOMETRIES, help="serve `engine.bench serve-pair` of this geometry")
    known.add_argument("--profile", default="code", help="its modelled acceptance: code, chat, measured:<pair>")
    known.add_argument("--prompt-len", type=int, default=16, help="random token-id prompts of this length")
    known.add_argument("--num-prompts", type=int, default=64)
    add_device_args(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    setup_logging(args.verbose)
    counts = (args.repeats, args.min_requests, args.max_tokens, args.warmup_requests)
    if min(args.rates) <= 0 or args.duration_s <= 0 or min(counts) < 1:
        raise SystemExit(
            "--rates and --duration-s must be > 0; --repeats, --min-requests, --max-tokens, --warmup-requests >= 1"
        )
    try:
        arms = parse_arms(args.arms)
    except ValueError as err:
        raise SystemExit(f"--arms: {err}") from None
    command_of, prompts, headroom, about = known_workload(args) if args.geometry else file_workload(args, arms)
    args.max_model_len = max(len(p) for p in prompts) + args.max_tokens + headroom + 1
    args.out.mkdir(parents=True, exist_ok=True)
    labels = [a.label for a in arms]
    meta = run_meta("serve-load", resolve_device(args.device), list(argv) if argv is not None else None)
    meta.update(about, num_prompts=len(prompts))
    servers = start_servers(arms, command_of, args)
    try:
        write = lambda rows: write_outputs(args.out, rows, summarize(rows, labels), labels, meta)
        run_load(servers, prompts, args, write)
    finally:
        for s in servers:
            s.stop()
    return 0


def write_outputs(out: Path, rows: list[dict], summary: list[dict], arms: list[str], meta: dict) -> None:
    write_csv(out / "serve_load.csv", rows)
    write_csv(out / "serve_load_summary.csv", summary)
    table = markdown(summary, arms[0])
    note = (
        "\nITL is the gap between streamed chunks (a speculative round sends its tokens in one chunk); "
        "TPOT is each request's (last chunk - first chunk) / (tokens - 1).\n"
    )
    if "modelled" in meta:
        note += f"\nBench-only pair: {meta['target']}; {meta['drafter']}. Modelled: {meta['modelled']}.\n"
    (out / "serve_load.md").write_text(f"# Open-loop serving load\n\n{meta_lines(meta)}\n{table}\n{note}")
    write_json(out / "serve_load.json", {**meta, "arms": arms, "summary": summary})
    print(table)
    log.info("wrote %s/serve_load.csv, serve_load_summary.csv, serve_load.md, serve_load.json", out)
