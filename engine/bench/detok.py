"""Host cost of detokenization per output token, incremental against the whole decode it replaced:
the stop-string scan (engine/stopping.py, run after every committed token) and a streamed choice's
running text (engine/serve/text.py, run after every step), one token per call, on CPU.

    python -m engine.bench detok --tokens 4096 --repeats 3
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import time
from collections.abc import Callable
from functools import partial

import torch

from engine.bench.meta import meta_lines, run_meta
from engine.bench.report import markdown_table
from engine.config import SamplingParams
from engine.outputs import RequestOutput
from engine.serve.text import Choice
from engine.shipped import shipped_pair
from engine.stopping import StopStrings

STOP = "@@never@@"


class WholeDecodeScan:
    """The stop scan before incremental decoding (dcc86ae): the whole output decoded every token."""

    def __init__(self, stops: list[str], decode: Callable[[list[int]], str]):
        self.stops, self.decode, self.longest, self.checked = stops, decode, max(map(len, stops)), 0

    def find(self, ids: list[int]) -> int | None:
        text = self.decode(ids)
        start = max(0, self.checked - self.longest + 1)
        hits = [i for i in (text.find(s, start) for s in self.stops) if i >= 0]
        self.checked = len(text.rstrip("\ufffd"))
        return min(hits) if hits else None


class WholeDecodeChoice:
    """A streamed choice's running text before incremental decoding (aec3db5): the whole output
    decoded every update."""

    def __init__(self, decode: Callable[[list[int]], str], hold: int):
        self.decode, self.hold, self.sent = decode, hold, ""

    def update(self, out: RequestOutput) -> str:
        text = self.decode(out.token_ids).rstrip("\ufffd")
        text = text[: max(0, len(text) - self.hold)]
        new, self.sent = (text[len(self.sent) :], text) if len(text) > len(self.sent) else ("", self.sent)
        return new


def _arms(tokenizer) -> dict[str, Callable[[], Callable[[list[int]], object]]]:
    """arm -> a factory of one request's per-token call."""
    decode = partial(tokenizer.decode, skip_special_tokens=True)

    def streamed(choice: Choice | WholeDecodeChoice) -> Callable[[list[int]], str]:
        return lambda ids: choice.update(RequestOutput("bench", [], ids, ids[-1:], False, None))

    return {
        "stop scan, whole decode (dcc86ae)": lambda: WholeDecodeScan([STOP], decode).find,
        "stop scan, incremental": lambda: StopStrings([STOP], decode).find,
        "streamed text, whole decode (aec3db5)": lambda: streamed(WholeDecodeChoice(decode, len(STOP) - 1)),
        "streamed text, incremental": lambda: streamed(Choice(0, tokenizer, SamplingParams(stop=[STOP]))),
    }


def _run(call: Callable[[list[int]], object], ids: list[int]) -> list[float]:
    """Seconds of each call, the output grown by one token before each."""
    out, times = [], []
    for token in ids:
        out.append(token)
        t = time.perf_counter()
        call(out)
        times.append(time.perf_counter() - t)
    return times


def measure(tokens: int, repeats: int) -> list[list[str]]:
    """Rows: arm, mean µs per call over all tokens, over the first 256, over the last 256."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(shipped_pair("tiny")[0]))
    ids = tokenizer.encode(inspect.getsource(inspect), add_special_tokens=False, verbose=False)[:tokens]
    arms = _arms(tokenizer)
    runs: dict[str, list[list[float]]] = {name: [] for name in arms}
    for _ in range(repeats):
        for name, make in arms.items():
            runs[name].append(_run(make(), ids))
    window = min(256, len(ids))

    def us(name: str, part: slice) -> str:
        return f"{statistics.median(1e6 * statistics.fmean(t[part]) for t in runs[name]):.1f}"

    return [[name, us(name, slice(None)), us(name, slice(window)), us(name, slice(-window, None))] for name in arms]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine.bench detok", description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=4096, help="output tokens per run (default 4096)")
    p.add_argument("--repeats", type=int, default=3, help="runs of each arm, interleaved (default 3)")
    args = p.parse_args(argv)
    if args.tokens < 1 or args.repeats < 1:
        p.error("--tokens and --repeats must be at least 1")
    rows = measure(args.tokens, args.repeats)
    last = f"tokens {max(1, args.tokens - 255)}-{args.tokens}"
    print(meta_lines(run_meta("detok", torch.device("cpu"), argv)))
    print(markdown_table(["per-token call", "µs mean", "tokens 1-256", last], rows))
    return 0
