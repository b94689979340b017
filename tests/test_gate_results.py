"""The capture-content and server children's result lines: parsed (trace_tools.results), judged
(gates/result_checks.py: good lines pass, each planted fault fails by name), and the pieces of the
children that compute them (the row comparison, the aligned resumed rounds, the served-token walk)."""

from __future__ import annotations

import pytest
import torch

from gates.capture_child import Run, compare_rows, resume_counts, resumed_rounds
from gates.lossless import LosslessError
from gates.result_checks import RESUME_SLACK, capture_problems, server_problems
from gates.served_tokens import served_tokens
from trace_tools import RequestLine, RoundRow, TraceError
from trace_tools.results import capture_lines, lossless_failures, resume_lines, server_lines

CAPTURE = (
    "[capture] numerics=invariant bit_identical=1 requests=3 compared_rows=400 gated_rows=40 mismatched_rows=0 "
    "max_diff=0 tolerance=0"
)
RESUME = (
    "[resume] numerics=invariant requests=3 rounds=19 accepted=73 reference_accepted=73 verified=117 "
    "reference_verified=117 mismatched_rounds=0"
)
SERVER = (
    "[server] requests=4 completion_tokens=176 disconnects=1 aborted=1 running=0 kv_blocks_free=1024 "
    "kv_blocks_total=1024"
)


def judge(capture: str = CAPTURE, resume: str = RESUME) -> list[str]:
    return capture_problems(capture_lines([capture]), resume_lines([resume]))


def test_the_lines_parse():
    (c,) = capture_lines(["x " + CAPTURE])
    assert (c.numerics, c.bit_identical, c.compared_rows, c.gated_rows, c.max_diff, c.tolerance) == (
        "invariant",
        1,
        400,
        40,
        0.0,
        0.0,
    )
    (r,) = resume_lines([RESUME])
    assert (r.rounds, r.accepted, r.reference_accepted, r.mismatched_rounds) == (19, 73, 73, 0)
    (s,) = server_lines([SERVER])
    assert (s.disconnects, s.aborted, s.kv_blocks_free) == (1, 1, 1024)
    assert lossless_failures(["a", "[lossless-failed] req-1 output token 3: x", "[lossless-failed]"]) == [
        "req-1 output token 3: x",
        "(no message)",
    ]
    with pytest.raises(TraceError, match="has no number in field max_diff="):
        capture_lines([CAPTURE.replace("max_diff=0", "max_diff=abc")])


def test_good_capture_and_resume_lines_pass():
    assert judge() == []
    default = CAPTURE.replace("invariant bit_identical=1", "default bit_identical=0").replace(
        "tolerance=0", "tolerance=0.0001"
    )
    slack = int(73 * (1 - RESUME_SLACK)) + 1
    near = RESUME.replace("invariant", "default").replace(" accepted=73 ", f" accepted={slack} ")
    assert judge(default, near.replace("mismatched_rounds=0", "mismatched_rounds=2")) == []


def test_rows_that_differ_fail_by_name():
    (found,) = judge(CAPTURE.replace("mismatched_rows=0", "mismatched_rows=40").replace("max_diff=0", "max_diff=2.33"))
    assert found.startswith("capture content: 40 of 400 drafter-context rows (40 of them stored by gated rounds)")
    assert "bit-identical rows required" in found
    (found,) = judge(CAPTURE.replace("gated_rows=40", "gated_rows=0"))
    assert found == "capture content: no row a gated round stored was compared"
    (found,) = judge(CAPTURE.replace("tolerance=0", "tolerance=0.0001"))
    assert found == "capture content: bit-identical numerics compared at tolerance 0.0001"


def test_acceptance_after_resume_fails_by_name():
    (found,) = judge(
        resume=RESUME.replace("mismatched_rounds=0", "mismatched_rounds=3").replace(" accepted=73 ", " accepted=51 ")
    )
    assert found.startswith("acceptance after resume: 3 of 19 resumed rounds verified or accepted other drafts")
    collapsed = RESUME.replace("invariant", "default").replace(" accepted=73 ", " accepted=20 ")
    (found,) = judge(resume=collapsed)
    assert found == (
        "acceptance after resume: 20 drafts accepted over 19 resumed rounds against the ungated run's 73, "
        "more than 15% apart"
    )
    (found,) = judge(resume=RESUME.replace("rounds=19", "rounds=0"))
    assert found == "acceptance after resume: no resumed round to compare with the ungated run"
    assert judge(resume="") == ["1 [capture] and 0 [resume] lines: the capture child prints one each"]


def _rows(*requests: int) -> list[RoundRow]:
    return [RoundRow(r, False, 4, 2, 3) for r in requests]


REQUESTS = [RequestLine(i, 10, 44, 44) for i in range(4)]


def test_the_server_line_passes_and_each_fault_fails_by_name():
    assert server_problems(server_lines([SERVER]), _rows(0, 1, 2, 3, 4), REQUESTS) == []
    (found,) = server_problems(server_lines([SERVER.replace("aborted=1", "aborted=0")]), _rows(0), REQUESTS)
    assert found.startswith("the server aborted 0 of the 1 requests whose client left before the first output")
    held = SERVER.replace("kv_blocks_free=1024", "kv_blocks_free=1016")
    (found,) = server_problems(server_lines([held]), _rows(0), REQUESTS)
    assert found.endswith("1016 of 1024 KV blocks are free: a request's KV blocks stay held")
    (found,) = server_problems(server_lines([SERVER]), _rows(0, 4, 5), REQUESTS)
    assert found.startswith("the trace names 2 requests beyond the child's 4, but only 1 clients left early")
    (found,) = server_problems(server_lines([SERVER]), _rows(0), REQUESTS[:3])
    assert found == "the server streamed 176 tokens but the child's requests report 132"
    assert server_problems([], [], REQUESTS) == ["0 [server] lines: the server child prints exactly one"]


def _run(rows: list[torch.Tensor], gated=(), rounds=()) -> Run:
    return Run(rounds=list(rounds), gated=list(gated), rows=rows)


def test_compare_rows_counts_rows_that_differ_and_those_gated_rounds_stored():
    ref = [torch.arange(24.0).view(6, 2, 2) + 1, torch.ones(6, 2, 2)]
    same = [t.clone() for t in ref]
    assert compare_rows(_run(same, gated=[2, 3]), _run(ref), prompt_len=2, tolerance=0) == (6, 2, 0, 0.0)
    off = [t.clone() for t in ref]
    off[1][4, 0, 0] += 1e-6  # the last bits of one row: not bit-identical, well within a tolerance
    assert compare_rows(_run(off), _run(ref), 2, tolerance=0)[2] == 1
    assert compare_rows(_run(off), _run(ref), 2, tolerance=1e-4)[2] == 0
    lost = [t.clone() for t in ref]
    lost[0][3] = 0  # a row never stored
    n, gated, bad, worst = compare_rows(_run(lost, gated=[2, 3, 9]), _run(ref[:1] + ref[1:]), 2, tolerance=1e-4)
    assert (n, gated, bad) == (6, 2, 1) and worst == pytest.approx(1.0)


def test_resumed_rounds_align_on_the_position_after_the_last_gated_round():
    gated = _run([], gated=[6, 7, 8], rounds=[(3, 7, 2), (9, 7, 3), (13, 7, 1)])
    ungated = _run([], rounds=[(3, 7, 2), (6, 7, 2), (9, 7, 3), (13, 7, 2), (16, 7, 0)])
    a, b = resumed_rounds(gated, ungated)
    assert a == [(9, 7, 3), (13, 7, 1)] and b == [(9, 7, 3), (13, 7, 2)]
    assert resume_counts(a, b) == (2, 4, 5, 14, 14, 1)


class Walk:
    """A stand-in target over the letters a..h: after any prefix it picks `pick[len]`, `second[len]` a
    logit behind; decode spells the letters."""

    def __init__(self, pick: list[int], second: dict[int, int]):
        self.pick, self.second = pick, second
        self.tokenizer = self

    def decode(self, ids, skip_special_tokens=True) -> str:
        return "".join("abcdefgh"[i] for i in ids)

    def last_logits(self, ids) -> torch.Tensor:
        j = len(ids) - 1  # the prompt is one token
        logits = torch.zeros(8)
        logits[self.pick[j]] = 2.0
        if j in self.second:
            logits[self.second[j]] = 1.0
        return logits

    def generate(self, prompts, params):
        (ids,) = prompts
        out = [self.pick[len(ids) - 1 + i] for i in range(params.max_tokens)]
        return [type("Out", (), {"token_ids": out})()]


def test_served_tokens_follow_plain_greedy_and_find_a_divergence_along_the_target():
    walk = Walk(pick=[0, 1, 2, 3, 4], second={1: 6})
    assert served_tokens(walk, [7], "abcd", 4, [0, 1, 2, 3]) == [0, 1, 2, 3]
    # The server took the runner-up g at position 1, then the target's own choice from there on.
    assert served_tokens(walk, [7], "agcd", 4, [0, 1, 2, 3]) == [0, 6, 2, 3]
    with pytest.raises(LosslessError, match="no token among the target's top 8 after 1 served tokens spells"):
        served_tokens(Walk(pick=[0, 1, 2, 3], second={}), [7], "a?cd", 4, [0, 1, 2, 3])
    with pytest.raises(LosslessError, match="the streamed text is not what 3 tokens along the target spell"):
        served_tokens(walk, [7], "abcd", 3, [0, 1, 2, 3])


def test_the_capture_child_refuses_an_unknown_numerics(capsys):
    from gates.capture_child import main

    with pytest.raises(SystemExit) as exit_:
        main(["--numerics", "fast"])
    assert exit_.value.code == 2 and "invalid choice: 'fast'" in capsys.readouterr().err
