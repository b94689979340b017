"""gates/lossless.check on a stand-in target: every output token is checked (not only up to the first
divergence), near-ties are counted and capped, and an output ends exactly where plain decode ends."""

from __future__ import annotations

import pytest
import torch

from gates.lossless import MARGIN, Tally, check

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


def test_every_token_after_an_excused_divergence_is_still_checked():
    # Plain took 5 at position 1; speculative took the near-tie 6 and then went on along its own
    # prefix, where the target picks 2, 3. A wrong token at position 3 must fail, not hide behind
    # the first divergence.
    target = Target([4, 5, 2, 3], ties={1: (6, MARGIN / 2)})
    tally = Tally()
    check(target, PROMPT, [4, 5, 0, 0], [4, 6, 2, 3], tally, exact=False, max_tokens=4)
    assert (tally.compared_tokens, tally.excused, target.calls) == (4, 1, 3)
    with pytest.raises(AssertionError, match="output token 3: the target picks 3, speculative 1"):
        check(target, PROMPT, [4, 5, 0, 0], [4, 6, 2, 1], Tally(), exact=False, max_tokens=4)


def test_a_divergence_beyond_the_margin_or_under_batch_invariance_fails():
    far = Target([4, 5, 2, 3], ties={1: (6, MARGIN * 2)})
    with pytest.raises(AssertionError, match="prefers its token by"):
        check(far, PROMPT, [4, 5, 2, 3], [4, 6, 2, 3], Tally(), exact=False, max_tokens=4)
    near = Target([4, 5, 2, 3], ties={1: (6, MARGIN / 2)})
    with pytest.raises(AssertionError, match="batch-invariant numerics excuse nothing"):
        check(near, PROMPT, [4, 5, 2, 3], [4, 6, 2, 3], Tally(), exact=True, max_tokens=4)


def test_excused_positions_are_capped():
    tally = Tally(requests=1, compared_tokens=128, excused=1)
    tally.check_cap(exact=False)
    tally.excused = 2
    with pytest.raises(AssertionError, match="2 near-ties excused over 128 tokens"):
        tally.check_cap(exact=False)
    with pytest.raises(AssertionError, match="cap 0"):
        Tally(1, 128, 1).check_cap(exact=True)


def test_an_output_ends_on_its_first_stop_token_and_nowhere_else():
    target = Target([4, 7, 5, 6])
    tally = Tally()
    check(target, PROMPT, [4, 7], [4, 7], tally, exact=False, max_tokens=64, stops={7})
    assert tally.compared_tokens == 2
    # The planted fault: a stop token inside an accepted run does not end the request.
    with pytest.raises(AssertionError, match="output token 1 is the stop token 7, but the output goes on"):
        check(target, PROMPT, [4, 7], [4, 7, 5, 6], Tally(), exact=False, max_tokens=4, stops={7})
    with pytest.raises(AssertionError, match="ends after 2 of 64 tokens on \\[7\\], which is no stop token"):
        check(target, PROMPT, [4, 7], [4, 7], Tally(), exact=False, max_tokens=64)
