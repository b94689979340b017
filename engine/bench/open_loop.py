"""Open-loop load against an OpenAI-compatible server: Poisson arrivals, each request streamed, every
chunk's arrival time kept. Standard library only (the bench host needs no HTTP client package)."""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit


@dataclass
class RequestRecord:
    """One streamed request, times in seconds on the bench's perf_counter clock."""

    sent: float
    chunks: list[float] = field(default_factory=list)  # arrival of each chunk that carried text
    done: float | None = None
    output_tokens: int = 0  # from the final usage chunk
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        return self.chunks[0] - self.sent if self.chunks else None

    @property
    def gaps(self) -> list[float]:
        """Inter-chunk latencies: with speculation one chunk carries a whole round's tokens."""
        return [b - a for a, b in zip(self.chunks, self.chunks[1:], strict=False)]

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first."""
        if not self.chunks or self.output_tokens < 2:
            return None
        return (self.chunks[-1] - self.chunks[0]) / (self.output_tokens - 1)


def arrival_times(rate: float, count: int, seed: int) -> list[float]:
    """Offsets (s) of `count` Poisson arrivals at `rate` requests/s; the first at 0."""
    if rate <= 0 or count < 1:
        raise ValueError(f"need rate > 0 and count >= 1, got rate={rate}, count={count}")
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(count):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def parse_sse(lines: Iterable[bytes], record: RequestRecord, clock=time.perf_counter) -> None:
    """Fill `record` from a completions event stream (lines as read, b'\\n' included)."""
    for raw in lines:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[len(b"data:") :].strip()
        if data == b"[DONE]":
            break
        now = clock()
        event = json.loads(data)
        if "error" in event:
            record.error = str(event["error"])
            break
        if any(c.get("text") for c in event.get("choices", ())):
            record.chunks.append(now)
        if event.get("usage"):
            record.output_tokens = int(event["usage"]["completion_tokens"])
    record.done = clock()


def stream_one(url: str, body: dict, record: RequestRecord, timeout_s: float) -> None:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout_s)
    try:
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            record.error = f"HTTP {resp.status}: {resp.read()[:300].decode(errors='replace')}"
            return
        parse_sse(iter(resp.readline, b""), record)
    except (OSError, http.client.HTTPException, json.JSONDecodeError) as err:
        record.error = f"{type(err).__name__}: {err}"
    finally:
        conn.close()


def run_open_loop(
    url: str,
    model: str,
    prompts: Sequence[Sequence[int]],
    offsets: Sequence[float],
    max_tokens: int,
    timeout_s: float = 600.0,
) -> tuple[list[RequestRecord], float]:
    """Send request i (prompts[i % len]) at offsets[i] after the start, each on its own thread, greedy
    with EOS ignored (fixed output length); returns the records and the wall time to the last finish."""
    records: list[RequestRecord] = []
    threads: list[threading.Thread] = []
    start = time.perf_counter()
    for i, offset in enumerate(offsets):
        delay = start + offset - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        body = dict(model=model, prompt=list(prompts[i % len(prompts)]), max_tokens=max_tokens, temperature=0)
        body.update(ignore_eos=True, stream=True, stream_options={"include_usage": True})
        record = RequestRecord(sent=time.perf_counter())
        records.append(record)
        t = threading.Thread(target=stream_one, args=(url, body, record, timeout_s), daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    return records, max((r.done or start) for r in records) - start
