"""gates/lossless.check on a stand-in target: every output token is checked (not only up to the first
divergence), a near-tie is excused only within the engine's measured error against an fp32 reference
(listed with its gap), and an output ends exactly where plain decode ends (stop token or stop string)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from gates.lossless import LosslessError, Tally, check
from gates.near_tie import Fp32Reference
from trace_tools.results import excused_lines

PROMPT = [1, 2, 3]
VOCAB = 8


class Target:
    """last_logits of a target whose choice after any prefix is `pick[len(prefix)]`, with a runner-up
    `gap` logits behind at the positions listed in `ties`."""

    def __init__(self, pick: list[int], ties: dict[int, tuple[int, float]] | None = None):
        self.pick, self.ties, self.calls = pick, ties or {}, 0

    def last_logits(self, ids: list[int]) -> torch.Tensor:
        self.calls += 1
        j = len(ids) - len(PROMPT)
        logits = torch.zeros(VOCAB)
        logits[self.pick[j]] = 5.0
        if j in self.ties:
            token, gap = self.ties[j]
            logits[token] = 5.0 - gap
        return logits


def test_equal_outputs_need_no_extra_forward():
    target, tally = Target([4, 5, 6, 7]), Tally()
    check(target, PROMPT, [4, 5, 6, 7], [4, 5, 6, 7], tally, exact=False, max_tokens=4)
    assert (tally.requests, tally.compared_tokens, tally.excused, target.calls) == (1, 4, 0, 0)


class Reference:
    """An fp32 reference of the stand-in target: its logits, off by `error` on every token but the top
    one at the positions listed in `ties` (so the engine's error there is `error`)."""

    def __init__(self, target: Target, error: float = 0.0):
        self.target, self.error = target, error

    def logits(self, ids: list[int]) -> torch.Tensor:
        logits = self.target.last_logits(ids)
        return logits + self.error * (logits < logits.max())


def test_every_token_after_an_excused_divergence_is_still_checked():
    # Plain took 5 at position 1; speculative took the near-tie 6 (0.01 behind in fp32, where the
    # engine's error is 0.05: bound 0.1) and then went on along its own prefix, where the target picks
    # 2, 3. A wrong token at position 3 must fail, not hide behind the first divergence.
    target = Target([4, 5, 2, 3], ties={1: (6, 0.06)})
    ref = Reference(target, error=0.05)
    tally = Tally()
    check(target, PROMPT, [4, 5, 0, 0], [4, 6, 2, 3], tally, exact=False, max_tokens=4, request="req-7", reference=ref)
    assert (tally.compared_tokens, tally.excused, target.calls) == (4, 1, 4)  # 3 engine calls, 1 fp32 at j=1
    ((request, excuse),) = tally.excuses
    assert (request, excuse.position, excuse.token, excuse.top) == ("req-7", 1, 6, 5)
    assert excuse.gap == pytest.approx(0.01, abs=1e-6) and excuse.bound == pytest.approx(0.1, abs=1e-6)
    with pytest.raises(LosslessError, match="req-7 output token 3: the target picks 3, speculative 1"):
        check(target, PROMPT, [4, 5, 0, 0], [4, 6, 2, 1], Tally(), False, 4, request="req-7", reference=ref)


def test_a_divergence_beyond_the_bound_or_under_batch_invariance_fails(capsys):
    target = Target([4, 5, 2, 3], ties={1: (6, 0.5)})  # a planted wrong token: 0.5 behind, error 0.05
    with pytest.raises(LosslessError, match="0.45 logits behind the top one, over the bound 0.1"):
        check(target, PROMPT, [4, 5, 2, 3], [4, 6, 2, 3], Tally(), False, 4, reference=Reference(target, 0.05))
    assert capsys.readouterr().out.startswith("[lossless-failed] ? output token 1: the target picks 5")
    near = Target([4, 5, 2, 3], ties={1: (6, 0.06)})
    with pytest.raises(LosslessError, match="batch-invariant numerics excuse nothing"):
        check(near, PROMPT, [4, 5, 2, 3], [4, 6, 2, 3], Tally(), exact=True, max_tokens=4, reference=Reference(near))


def test_an_fp32_engine_is_its_own_reference_and_excuses_nothing():
    target = Target([4, 5, 2, 3], ties={1: (6, 1e-6)})  # a hair behind: nothing in fp32 can flip it
    target.dtype, target.ops = torch.float32, SimpleNamespace(name="torch")
    ref = Fp32Reference(target, build=lambda: pytest.fail("an fp32 torch engine builds no reference"))
    with pytest.raises(LosslessError, match="over the bound 0"):
        check(target, PROMPT, [4, 5, 2, 3], [4, 6, 2, 3], Tally(), exact=False, max_tokens=4, reference=ref)


def test_the_excused_lines_read_back():
    target = Target([4, 5, 2, 3], ties={1: (6, 0.06)})
    tally, ref = Tally(), Reference(target, 0.05)
    check(target, PROMPT, [4, 5, 2, 3], [4, 6, 2, 3], tally, False, 4, request="req-2", reference=ref)
    ((request, excuse),) = tally.excuses
    (line,) = excused_lines([excuse.line("t", request)])
    assert (line.test, line.request, line.position, line.token, line.top) == ("t", "req-2", 1, 6, 5)
    assert (line.gap, line.bound) == (pytest.approx(excuse.gap, rel=1e-8), pytest.approx(excuse.bound, rel=1e-8))


def test_an_output_ends_on_its_first_stop_token_and_nowhere_else():
    target = Target([4, 7, 5, 6])
    tally = Tally()
    check(target, PROMPT, [4, 7], [4, 7], tally, exact=False, max_tokens=64, stops={7})
    assert tally.compared_tokens == 2
    # The planted fault: a stop token inside an accepted run does not end the request.
    with pytest.raises(LosslessError, match="output token 1 is the stop token 7, but the output goes on"):
        check(target, PROMPT, [4, 7], [4, 7, 5, 6], Tally(), exact=False, max_tokens=4, stops={7})
    with pytest.raises(LosslessError, match="ends after 2 of 64 tokens on \\[7\\], which stops nothing"):
        check(target, PROMPT, [4, 7], [4, 7], Tally(), exact=False, max_tokens=64)


class Decoder:
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join("abcdefgh"[i] for i in ids)


def test_an_output_ends_on_the_token_completing_its_first_stop_string():
    target = Target([4, 7, 5, 6])  # "e", "h", "f", "g"
    target.tokenizer = Decoder()
    tally = Tally()
    check(target, PROMPT, [4, 7], [4, 7], tally, exact=False, max_tokens=64, stop_strings=["eh", "zz"])
    assert tally.compared_tokens == 2
    with pytest.raises(LosslessError, match="output token 1 completes the stop string 'eh', but the output goes on"):
        check(target, PROMPT, [4, 7, 5], [4, 7, 5], Tally(), exact=False, max_tokens=64, stop_strings=["eh"])
    with pytest.raises(LosslessError, match="which stops nothing"):
        check(target, PROMPT, [4, 7], [4, 7], Tally(), exact=False, max_tokens=64, stop_strings=["hf"])
