"""The lossless comparison: every token of the speculative output against the target's own choice.

A position whose prefix and token equal plain greedy's is the target's own decode choice. Any other
position is checked against the target's prefill over the speculative prefix (the regret oracle):
its token must be the argmax, or within MARGIN of it (a near-tie, counted as excused). Excused
positions are capped (gates/cases.py: 1 per 128 compared tokens under default numerics, none under
batch-invariant numerics). An output ends where plain decode ends: at max_tokens, or on its first
stop token and nowhere else.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from engine import Engine, EngineConfig, SamplingParams
from engine.knobs import read_gate_knobs
from engine.shipped import shipped_prompts
from gates.cases import excuse_cap

MARGIN = 0.20  # logits; bf16 verify vs decode kernels can flip ties this close
TOKENS = 64
FALLBACK_PROMPTS = [
    "def fibonacci(n):\n    ",
    "The capital of France is",
    "import os\nimport sys\n\n\ndef main():\n",
    "Speculative decoding speeds up inference by",
    "class Stack:\n    def __init__(self):\n",
    "for i in range(10):\n",
]


def batch_invariant() -> bool:
    return read_gate_knobs().batch_invariant


def gate_prompts(label: str, count: int) -> list[str]:
    """Held-out prompts of the shipped fixture pair, else generic prompts for external weights."""
    path = shipped_prompts("tiny")
    if label == "fixture:tiny" and path.is_file():
        lines = [json.loads(line)["text"] for line in path.read_text().splitlines() if line.strip()]
        return lines[:count]
    return (FALLBACK_PROMPTS * (count // len(FALLBACK_PROMPTS) + 1))[:count]


def build_engines(weights) -> tuple[Engine, Engine]:
    """A plain engine and a speculative engine on the same target weights, one process, one env."""
    common = dict(model=weights.target, batch_invariant=batch_invariant(), max_num_seqs=8)
    return Engine(EngineConfig(**common)), Engine(EngineConfig(draft_model=weights.drafter, **common))


def greedy(max_tokens: int, stop: Sequence[int] = ()) -> SamplingParams:
    """Greedy to max_tokens; with stop tokens, EOS and those end the request (else both are ignored)."""
    if stop:
        return SamplingParams(temperature=0, max_tokens=max_tokens, stop_token_ids=list(stop))
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)


def request_line(request_id: str, prompt_tokens: int, output_tokens: int, max_tokens: int) -> str:
    """The summary line the gate reads to cross-check the child's trace (trace_tools.request_lines)."""
    return (
        f"[DEBUG] DFlash request request={request_id} prompt_tokens={prompt_tokens} "
        f"output_tokens={output_tokens} max_tokens={max_tokens}"
    )


@dataclass
class Tally:
    requests: int = 0
    compared_tokens: int = 0
    excused: int = 0

    def line(self, test: str) -> str:
        return (
            f"[lossless] test={test} requests={self.requests} compared_tokens={self.compared_tokens} "
            f"excused={self.excused}"
        )

    def check_cap(self, exact: bool) -> None:
        cap = excuse_cap(self.compared_tokens, exact)
        assert self.excused <= cap, f"{self.excused} near-ties excused over {self.compared_tokens} tokens (cap {cap})"


def check(
    plain: Engine,
    prompt_ids: list[int],
    want: list[int],
    got: list[int],
    tally: Tally,
    exact: bool,
    max_tokens: int,
    stops: Collection[int] = (),
) -> None:
    """Assert every token of got is the target's choice (up to an excused near-tie) and that got
    ends where a plain greedy run on its own prefix ends; count what was compared."""
    tally.requests += 1
    for j, token in enumerate(got):
        if token in stops and j != len(got) - 1:
            raise AssertionError(f"output token {j} is the stop token {token}, but the output goes on")
        if got[: j + 1] == want[: j + 1]:
            continue  # plain greedy's own decode picked it over the same prefix
        logits = plain.last_logits(prompt_ids + got[:j])
        best = int(logits.argmax())
        if best == token:
            continue
        gap = float(logits[best] - logits[token])
        where = f"output token {j}: the target picks {best}, speculative {token} (plain {want[j : j + 1]})"
        assert not exact, f"batch-invariant numerics excuse nothing; {where}"
        assert gap <= MARGIN, f"{where}; the target prefers its token by {gap:.3f} > {MARGIN}"
        tally.excused += 1
    ended_on_stop = bool(got) and got[-1] in stops
    assert len(got) == max_tokens or ended_on_stop, (
        f"the output ends after {len(got)} of {max_tokens} tokens on {got[-1:]}, which is no stop token"
    )
    tally.compared_tokens += len(got)
