"""What the capture-content child's and the server child's result lines must show: pure functions of
the parsed lines (trace_tools.results), each proven to fail on a planted fault (tests/test_gate_results.py)."""

from __future__ import annotations

from collections.abc import Sequence

from trace_tools import RequestLine, RoundRow
from trace_tools.results import CaptureLine, ResumeLine, ServerLine

# Default numerics: the resumed rounds' accepted drafts may differ from the ungated run's by this share
# of the ungated run's (a near-tie in the drafter's argmax may move a round); measured 0 on CPU (fp32
# and bf16, the shipped tiny pair). A context the gated rounds left wrong moves them far more.
RESUME_SLACK = 0.15


def capture_problems(captures: Sequence[CaptureLine], resumes: Sequence[ResumeLine]) -> list[str]:
    """The [capture] line: every compared row within its tolerance (bit-identical at tolerance 0),
    gated rows among them; the [resume] line: the resumed rounds as the ungated run's."""
    if len(captures) != 1 or len(resumes) != 1:
        return [f"{len(captures)} [capture] and {len(resumes)} [resume] lines: the capture child prints one each"]
    (c,), (r,) = captures, resumes
    problems = []
    if c.gated_rows == 0:
        problems.append("capture content: no row a gated round stored was compared")
    if c.mismatched_rows:
        how = "bit-identical rows required" if c.tolerance == 0 else f"tolerance {c.tolerance:g} of the row's scale"
        problems.append(
            f"capture content: {c.mismatched_rows} of {c.compared_rows} drafter-context rows ({c.gated_rows} of "
            f"them stored by gated rounds) differ from the ungated run's for the same tokens (largest "
            f"difference {c.max_diff:.3g}; {how})"
        )
    if c.numerics == "invariant" and c.bit_identical and c.tolerance != 0:
        problems.append(f"capture content: bit-identical numerics compared at tolerance {c.tolerance:g}")
    problems += _resume_problems(r)
    return problems


def _resume_problems(r: ResumeLine) -> list[str]:
    if r.rounds == 0:
        return ["acceptance after resume: no resumed round to compare with the ungated run"]
    ours = (
        f"{r.accepted} drafts accepted over {r.rounds} resumed rounds against the ungated run's {r.reference_accepted}"
    )
    if r.numerics == "invariant" and r.mismatched_rounds:
        return [
            f"acceptance after resume: {r.mismatched_rounds} of {r.rounds} resumed rounds verified or accepted "
            f"other drafts than the ungated run's from the same positions ({ours})"
        ]
    if abs(r.accepted - r.reference_accepted) > RESUME_SLACK * r.reference_accepted:
        return [f"acceptance after resume: {ours}, more than {RESUME_SLACK:.0%} apart"]
    return []


def server_problems(
    servers: Sequence[ServerLine], rows: Sequence[RoundRow], requests: Sequence[RequestLine]
) -> list[str]:
    """The [server] line: every request whose client left early aborted, nothing running and every KV
    block free once they left; the trace names no request beyond the child's and the ones that left."""
    if len(servers) != 1:
        return [f"{len(servers)} [server] lines: the server child prints exactly one"]
    (s,) = servers
    problems = []
    if s.aborted < s.disconnects:
        problems.append(
            f"the server aborted {s.aborted} of the {s.disconnects} requests whose client left before the first "
            "output: their KV blocks stayed held until they ran out of budget"
        )
    if s.running or s.kv_blocks_free != s.kv_blocks_total:
        problems.append(
            f"after every client left, {s.running} requests still run and {s.kv_blocks_free} of "
            f"{s.kv_blocks_total} KV blocks are free: a request's KV blocks stay held"
        )
    mine = {q.request for q in requests}
    others = {r.request for r in rows} - mine
    if len(others) > s.disconnects:
        problems.append(
            f"the trace names {len(others)} requests beyond the child's {len(mine)}, but only {s.disconnects} "
            "clients left early: the ids are wrong"
        )
    produced = sum(q.output_tokens for q in requests)
    if s.completion_tokens != produced:
        problems.append(f"the server streamed {s.completion_tokens} tokens but the child's requests report {produced}")
    return problems
