"""The lossless comparison: every token of the speculative output against the target's own choice.

A position whose prefix and token equal plain greedy's is the target's own decode choice. Any other
position is checked against the target's prefill over the speculative prefix (the regret oracle):
its token must be the argmax, or an excused near-tie (gates/near_tie.py: within what the engine's
numerics can flip, judged by an fp32 re-evaluation; none under batch-invariant numerics), each listed
on an `[excused]` line. An output ends where plain decode ends: at max_tokens, or on its first stop
token or the token completing its first stop string, and nowhere else. A failure prints one
`[lossless-failed]` line naming it before it raises, so the gate's verdict can name it too.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.knobs import read_gate_knobs
from engine.sampler import penalized_logits
from engine.shipped import shipped_prompts
from gates.near_tie import Excuse, Fp32Reference, judge, reference_for
from trace_tools.results import FAILED_MARKER

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


class LosslessError(AssertionError):
    """An output token that is not the target's choice, or an output that ends where plain decode does not."""


def fail(message: str) -> None:
    """Print the line the gate reads (trace_tools.lossless_failures), then raise."""
    print(f"{FAILED_MARKER} {message}", flush=True)
    raise LosslessError(message)


@dataclass
class Tally:
    requests: int = 0
    compared_tokens: int = 0
    excuses: list[tuple[str, Excuse]] = field(default_factory=list)  # (request, excuse)

    @property
    def excused(self) -> int:
        return len(self.excuses)

    def line(self, test: str) -> str:
        return (
            f"[lossless] test={test} requests={self.requests} compared_tokens={self.compared_tokens} "
            f"excused={self.excused}"
        )

    def report(self, test: str) -> None:
        """Print the result line and one `[excused]` line per excused position."""
        for request, excuse in self.excuses:
            print(excuse.line(test, request))
        print(self.line(test))


def check(
    plain: Engine,
    prompt_ids: list[int],
    want: list[int],
    got: list[int],
    tally: Tally,
    exact: bool,
    max_tokens: int,
    stops: Collection[int] = (),
    *,
    request: str = "?",
    stop_strings: Sequence[str] = (),
    reference: Fp32Reference | None = None,
    penalties: SamplingParams | None = None,
) -> None:
    """Fail unless every token of got is the target's choice (or an excused near-tie) and got ends
    where a plain greedy run on its own prefix ends; count what was compared. request: the output's
    id, for the messages; stop_strings: the request's (decoded with plain's tokenizer); penalties:
    the request's params when penalized: the target's choice is then the argmax of its logits
    penalized over the prompt and got's tokens before the position (engine.sampler)."""
    tally.requests += 1
    for j, token in enumerate(got):
        if token in stops and j != len(got) - 1:
            fail(f"{request} output token {j} is the stop token {token}, but the output goes on")
        if got[: j + 1] == want[: j + 1]:
            continue  # plain greedy's own decode picked it over the same prefix
        ids = prompt_ids + got[:j]
        ref = reference or reference_for(plain)
        logits = plain.last_logits(ids)
        if penalties is not None and penalties.penalized:
            logits, ref = penalize(logits, prompt_ids, got[:j], penalties), _Penalized(ref, prompt_ids, penalties)
        best = int(logits.argmax())
        if best == token:
            continue
        where = f"{request} output token {j}: the target picks {best}, speculative {token} (plain {want[j : j + 1]})"
        if exact:
            fail(f"batch-invariant numerics excuse nothing; {where}")
        excuse = judge(ref, ids, logits, token, j)
        if not excuse.holds:
            behind = f"in fp32 it is {excuse.gap:.4g} logits behind the top one, over the bound {excuse.bound:.4g}"
            fail(f"{where}; {behind}")
        tally.excuses.append((request, excuse))
    ended = bool(got) and got[-1] in stops
    if stop_strings:
        ended = ended or _ends_on_stop_string(plain, got, stop_strings, request)
    if len(got) != max_tokens and not ended:
        fail(f"{request} output ends after {len(got)} of {max_tokens} tokens on {got[-1:]}, which stops nothing")
    tally.compared_tokens += len(got)


def penalize(logits: torch.Tensor, prompt_ids: Sequence[int], output: Sequence[int], params: SamplingParams):
    """One row of logits [V] with params' penalties over (prompt, output before it)."""
    return penalized_logits(logits[None], [(prompt_ids, output)], [params])[0]


class _Penalized:
    """A reference whose logits after ids (the prompt, then output) carry the request's penalties."""

    def __init__(self, ref: Fp32Reference, prompt_ids: Sequence[int], params: SamplingParams):
        self.ref, self.prompt, self.params = ref, list(prompt_ids), params

    def logits(self, ids: Sequence[int]) -> torch.Tensor:
        return penalize(self.ref.logits(ids).float(), self.prompt, list(ids)[len(self.prompt) :], self.params)


def _ends_on_stop_string(plain: Engine, got: list[int], stop_strings: Sequence[str], request: str) -> bool:
    """Whether got's last token completes its first stop string; fail if an earlier one already did.
    Checked on the decoded prefixes, independently of the engine's incremental search."""
    for j in range(len(got)):
        text = plain.tokenizer.decode(got[: j + 1], skip_special_tokens=True)
        hit = next((s for s in stop_strings if s in text), None)
        if hit is None:
            continue
        if j != len(got) - 1:
            fail(f"{request} output token {j} completes the stop string {hit!r}, but the output goes on")
        return True
    return False
