"""The lossless comparison: speculative greedy against plain greedy, with the regret oracle.

Exact token equality. In the default numerics a divergence is excused only when the target's own
prefill over the shared prefix picks the speculative token, or the two candidates are within
MARGIN of each other (a near-tie); every excused divergence is counted. Under batch-invariant
numerics nothing is excused.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from engine import Engine, EngineConfig, SamplingParams
from engine.knobs import parse_flag
from engine.shipped import shipped_prompts

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
    raw = os.environ.get("PEGAINFER_TEST_BATCH_INVARIANT")
    return raw is not None and parse_flag("PEGAINFER_TEST_BATCH_INVARIANT", raw)


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


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True)


@dataclass
class Tally:
    requests: int = 0
    compared_tokens: int = 0
    excused: int = 0

    def line(self, test: str) -> str:
        return (
            f"[lossless] test={test} requests={self.requests} compared_tokens={self.compared_tokens} "
            f"excused_divergences={self.excused}"
        )


def check(plain: Engine, prompt_ids: list[int], want: list[int], got: list[int], tally: Tally, exact: bool) -> None:
    """Assert got == want up to an excused divergence; count what was compared."""
    tally.requests += 1
    j = next((i for i, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), None)
    if j is None:
        assert len(want) == len(got), f"lengths differ: plain {len(want)} tokens, speculative {len(got)}"
        tally.compared_tokens += len(want)
        return
    tally.compared_tokens += j
    where = f"first divergence at output token {j}: plain {want[j]}, speculative {got[j]}"
    assert not exact, f"batch-invariant numerics excuse nothing; {where}"
    logits = plain.last_logits(prompt_ids + want[:j])
    picks_spec = int(logits.argmax()) == got[j]
    gap = float(logits[want[j]] - logits[got[j]])
    assert picks_spec or gap <= MARGIN, f"{where}; the target prefers plain's token by {gap:.3f} > {MARGIN}"
    tally.excused += 1
