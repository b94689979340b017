"""The server child: the gate's lossless check through `pegaspec serve` and the official `openai`
client (streaming), then a client that leaves before its first output, whose request must be aborted
and its KV freed.

    python -m gates.serve_child

It starts `python -m engine serve` (what `pegaspec serve` runs) on a free loopback port with the gate
weights (the trace and the lever knobs from its environment; a planted canary reaches the server
too), streams the concurrent child's four prompts with staggered budgets, each started once the one
before it streamed its first chunk (so the server numbers them req-0.. in order), and checks every
streamed text against a plain engine in this process: equal text is plain greedy's tokens; where it
differs, the tokens are found along the target (gates/served_tokens.py) and go through the same
lossless check, near-tie rule included. Then one more stream is opened and closed before any chunk is
read. Prints the server's trace (its stderr is this child's), a `DFlash request` line per streamed
request, the lossless lines and a `[server]` line.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

from engine import Engine, EngineConfig
from gates.canaries import ENV as CANARY_ENV
from gates.lossless import Tally, check, gate_prompts, greedy, request_line
from gates.plant import canary_argv
from gates.served_tokens import served_tokens
from gates.weights import resolve_gate_weights

log = logging.getLogger(__name__)

BUDGETS = (64, 24, 48, 40)
LEFT_EARLY_TOKENS = 400  # far more rounds than noticing a gone client takes; a server that never aborts runs them all
START_LIMIT_S = 300.0
SETTLE_LIMIT_S = 300.0  # bounds on waiting, not timing assertions


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(target: str, drafter: str, port: int) -> subprocess.Popen:
    argv = [sys.executable, "-m", "engine", "serve", "--model", target, "--draft-model", drafter]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--max-num-seqs", "8"]
    canary = os.environ.get(CANARY_ENV)
    return subprocess.Popen(canary_argv(canary, argv) if canary else argv, stdin=subprocess.DEVNULL)


def metrics(http, url: str) -> dict[str, float]:
    text = http.get(url + "/metrics").text
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^pegaspec_(\w+) (\S+)$", text, re.MULTILINE)}


def wait_until(predicate, what: str, limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"gave up waiting for {what} after {limit_s:g} s")
        time.sleep(0.1)


def stream_all(client, model: str, prompts: Sequence[list[int]]) -> list[tuple[str, int]]:
    """(text, completion tokens) per prompt; each stream starts once the one before it got a chunk."""
    results: list[tuple[str, int] | BaseException | None] = [None] * len(prompts)
    started = [threading.Event() for _ in prompts]

    def one(i: int) -> None:
        try:
            chunks = client.completions.create(
                model=model,
                prompt=prompts[i],
                max_tokens=BUDGETS[i],
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
            )
            text, tokens = [], 0
            for chunk in chunks:
                started[i].set()
                text += [c.text for c in chunk.choices]
                tokens = chunk.usage.completion_tokens if chunk.usage else tokens
            results[i] = ("".join(text), tokens)
        except BaseException as err:  # reported by the caller
            results[i] = err
        finally:
            started[i].set()

    threads = []
    for i in range(len(prompts)):
        threads.append(threading.Thread(target=one, args=(i,), daemon=True))
        threads[-1].start()
        started[i].wait()
    for t in threads:
        t.join()
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results  # type: ignore[return-value]


def run() -> int:
    import httpx
    import openai

    weights, reason = resolve_gate_weights()
    if weights is None:
        log.error("no gate weights: %s", reason)
        return 1
    port = free_port()
    server = start_server(weights.target, weights.drafter, port)  # it loads while this process does
    url = f"http://127.0.0.1:{port}"
    try:
        plain = Engine(EngineConfig(model=weights.target, max_num_seqs=1, trace=False))
        prompts = [list(plain.tokenizer.encode(p, add_special_tokens=False)) for p in gate_prompts(weights.label, 4)]
        with httpx.Client(timeout=60) as http:
            wait_until(lambda: _healthy(http, url) or server.poll() is not None, "the server to start", START_LIMIT_S)
            if server.poll() is not None:
                log.error("the server exited %s before it served", server.returncode)
                return 1
            client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=SETTLE_LIMIT_S)
            model = client.models.list().data[0].id
            streamed = stream_all(client, model, prompts)
            tally = Tally()
            for i, (ids, budget, (text, tokens)) in enumerate(zip(prompts, BUDGETS, streamed, strict=True)):
                (want,) = plain.generate([ids], greedy(budget))
                got = served_tokens(plain, ids, text, tokens, want.token_ids)
                print(request_line(f"req-{i}", len(ids), tokens, budget))
                check(plain, ids, want.token_ids, got, tally, False, budget, request=f"req-{i}")
            tally.report("served_lossless")
            before = metrics(http, url)
            left = client.completions.create(
                model=model,
                prompt=prompts[0],
                max_tokens=LEFT_EARLY_TOKENS,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            left.close()  # the client leaves before it reads its first chunk
            # /metrics is a snapshot the engine loop takes after routing a step's outputs: first see the
            # request admitted (or already aborted), then wait until nothing runs.
            seen = lambda m: m["running"] >= 1 or m["aborted_total"] > before["aborted_total"]
            wait_until(lambda: seen(metrics(http, url)), "the request to reach the engine", SETTLE_LIMIT_S)
            wait_until(lambda: metrics(http, url)["running"] == 0, "the requests to leave the batch", SETTLE_LIMIT_S)
            after = metrics(http, url)
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
    aborted = int(after["aborted_total"] - before["aborted_total"])
    print(
        f"[server] requests={len(prompts)} completion_tokens={sum(t for _, t in streamed)} disconnects=1 "
        f"aborted={aborted} running={int(after['running'])} kv_blocks_free={int(after['kv_blocks_free'])} "
        f"kv_blocks_total={int(after['kv_blocks_total'])}"
    )
    return 0


def _healthy(http, url: str) -> bool:
    try:
        return http.get(url + "/health").text == "ok"
    except Exception:  # not listening yet
        return False


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return run()
    except AssertionError as err:
        log.error("the lossless check failed: %s", err)
        return 1


if __name__ == "__main__":
    sys.exit(main())
