"""The levers gate: its six cases (plus the hedge case), how a lossless child is re-executed, and
what its output must show.

Everything but `run_child` is a pure function of the child's output, so each
check can be proven to fail on a planted fault (tests/test_levers_gate_checks.py).
"""

from __future__ import annotations

import contextlib
import enum
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from trace_tools import (
    HedgeRow,
    RecordRow,
    RoundRow,
    TraceError,
    hedge_trace_rows,
    levers_trace_rows,
    lossless_lines,
    summarize,
    summarize_hedge,
)
from trace_tools.summary import ChildSummary, HedgeSummary, resumed_and_accepted, rows_after_first_gate

CHILD_MODULE = "gates/test_lossless.py"
GREEDY = "test_greedy_matches_plain_greedy"
CONCURRENT = "test_concurrent_heterogeneous_is_lossless"
KNOB_PREFIX = "PEGAINFER_SPEC_"  # every lever knob (MAX_BATCH, MAX_DRAFTS, HEDGE*): a case sets its own only
TRACE_ENV = "PEGAINFER_TEST_LOG"
HEDGE_DRAFTER_ENV = "PEGAINFER_TEST_HEDGE_DRAFTER"  # only the hedge child gets it (the gate picks it)
CHILD_TIMEOUT_S = 1800
TAIL_LINES = 60
# Inherited from a parent pytest (or its xdist worker) they would change how the child runs:
# PYTEST_ADDOPTS may hold `-n`, which `-p no:xdist` turns into a usage error.
_PARENT_ONLY_ENV = ("PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST", "PYTEST_XDIST_")


class Expect(enum.Enum):
    ALL_GATED = "every round gated"
    TRIM = "no gated round; some round verifies exactly k drafts, none more"
    RESUME = "gated rounds, then gated requests speculate and accept again"
    HEDGE = "hedge chains verified; at least one chain wins and at least one is discarded"


@dataclass(frozen=True)
class LeverCase:
    child: str  # lossless child test function in CHILD_MODULE
    short: str
    knob: str  # the variable without its PEGAINFER_SPEC_ prefix
    value: int
    expect: Expect
    extra: tuple[tuple[str, str], ...] = ()  # more knobs of the same lever, e.g. (("HEDGE_POSITIONS", "0,1,2"),)

    @property
    def id(self) -> str:
        return f"{self.short}-{self.env_label.replace(' ', '-')}"

    @property
    def nodeid(self) -> str:
        return f"{CHILD_MODULE}::{self.child}"

    @property
    def env_var(self) -> str:
        return KNOB_PREFIX + self.knob

    @property
    def env_label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in ((self.knob, self.value), *self.extra))

    @property
    def env(self) -> dict[str, str]:
        return {KNOB_PREFIX + k: str(v) for k, v in ((self.knob, self.value), *self.extra)}


# SPEC section 3, in its order (the run record keeps it).
CASES: tuple[LeverCase, ...] = (
    LeverCase(GREEDY, "greedy", "MAX_BATCH", 1, Expect.ALL_GATED),
    LeverCase(GREEDY, "greedy", "MAX_DRAFTS", 4, Expect.TRIM),
    LeverCase(CONCURRENT, "concurrent", "MAX_DRAFTS", 4, Expect.TRIM),
    LeverCase(GREEDY, "greedy", "MAX_DRAFTS", 2, Expect.TRIM),
    LeverCase(CONCURRENT, "concurrent", "MAX_DRAFTS", 2, Expect.TRIM),
    LeverCase(CONCURRENT, "concurrent", "MAX_BATCH", 3, Expect.RESUME),
)
# Hedged verify (SPEC 2.7) needs a Markov-head drafter: the case runs the greedy child on one and
# skips with the reason when there is none.
HEDGE_CASES: tuple[LeverCase, ...] = (
    LeverCase(GREEDY, "greedy", "HEDGE", 8, Expect.HEDGE, (("HEDGE_POSITIONS", "0,1,2"),)),
)
ALL_CASES = CASES + HEDGE_CASES


def _requests(ids: Sequence[int]) -> str:
    return ", ".join(f"req-{i}" for i in ids)


def check_case(case: LeverCase, rows: Sequence[RoundRow], hedges: Sequence[HedgeRow] = ()) -> list[str]:
    """What the trace fails to show for this case; empty when it shows everything."""
    if not rows:
        return [f"the child printed no DFlash round lines (does {TRACE_ENV}=1 reach the engine's stderr?)"]
    s = summarize(rows)
    problems = []
    if case.expect is Expect.HEDGE:
        problems += _hedge_problems(case, s, summarize_hedge(hedges))
    elif case.expect is Expect.ALL_GATED:
        if s.gated_rounds == 0:
            problems.append(f"no gated round: {case.env_label} never tripped the gate")
        if s.speculating_rounds:
            spec = [r.request for r in rows if not r.gated]
            problems.append(
                f"{s.speculating_rounds} speculating rounds under {case.env_label}, which must "
                f"gate every round (requests {_requests(list(dict.fromkeys(spec)))})"
            )
    elif case.expect is Expect.TRIM:
        k = case.value
        if s.gated_rounds:
            problems.append(f"{s.gated_rounds} gated rounds under {case.env_label} alone: the gate must stay off")
        over = [r for r in rows if r.verified_draft > k]
        if over:
            problems.append(
                f"{len(over)} rounds verified more than {k} drafts "
                f"(up to {max(r.verified_draft for r in over)}): the trim leaks"
            )
        if not any(r.verified_draft == k for r in rows):
            widest = max(r.verified_draft for r in rows)
            problems.append(f"no round verified exactly {k} drafts (widest {widest}): the trim was never exercised")
    else:
        problems += _resume_problems(case, rows, s)
    return problems


def _hedge_problems(case: LeverCase, s: ChildSummary, h: HedgeSummary) -> list[str]:
    # Both paths must run: a win makes a chain's scratch KV and feature rows canonical, a discard
    # must leave no trace; the child's lossless comparison covers the output of both.
    problems = []
    if s.gated_rounds:
        problems.append(f"{s.gated_rounds} gated rounds under {case.env_label} alone: the gate must stay off")
    if h.chains == 0:
        problems.append(
            f"no hedge chain verified under {case.env_label} (no `DFlash hedge` line with chains > 0; "
            "is the drafter a Markov-head one?)"
        )
    else:
        if h.wins == 0:
            problems.append(f"no chain won in {h.hedged_rounds} hedged rounds: the win path never ran")
        if h.discards == 0:
            problems.append(f"every one of {h.chains} chains won: the discard path never ran")
    return problems


def _resume_problems(case: LeverCase, rows: Sequence[RoundRow], s: ChildSummary) -> list[str]:
    # A request that finishes while still gated never gets the chance to resume (under a 4 -> 3
    # shrink the shortest budget always does), so the per-request rule applies to every gated
    # request that speculates again; and at least one gated request must resume and accept,
    # which a gate that latches to plain decode can never show.
    problems = []
    if s.gated_rounds == 0:
        problems.append(f"no gated round: the batch never exceeded {case.env_label}")
    if s.speculating_rounds == 0:
        problems.append("no speculating round: speculation never resumed after the gate")
    after = rows_after_first_gate(rows)
    if after and not any(resumed_and_accepted(later) for later in after.values()):
        problems.append(
            f"no gated request ({_requests(list(after))}) later speculated and accepted a draft: the gate latches"
        )
    stalled = [
        req for req, later in after.items() if any(not r.gated for r in later) and not resumed_and_accepted(later)
    ]
    if stalled:
        problems.append(
            f"{_requests(stalled)} speculated again after being gated but never verified and accepted a draft"
        )
    return problems


@dataclass(frozen=True)
class ChildSpec:
    argv: tuple[str, ...]
    env: Mapping[str, str]  # the child's whole environment
    env_set: Mapping[str, str]  # what the gate set on top of its own environment
    env_removed: tuple[str, ...]  # what the gate took away

    def shell(self, cwd: Path) -> str:
        """A command that reproduces the child by hand (removed variables need `env -u`)."""
        unset = "".join(f"-u {name} " for name in self.env_removed)
        assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env_set.items())
        return f"cd {shlex.quote(str(cwd))} && env {unset}{assigns} {shlex.join(self.argv)}"


def child_spec(
    case: LeverCase,
    base_env: Mapping[str, str],
    python: str = sys.executable,
    extra_env: Mapping[str, str] | None = None,
) -> ChildSpec:
    """The child pytest run of one case: its node alone, output uncaptured, no workers, no reordering.
    extra_env: set on top (the hedge case's Markov drafter); the hedge drafter variable reaches no
    other child, so every other case keeps the pair's drafter."""
    argv = (
        python,
        "-m",
        "pytest",
        case.nodeid,
        "-x",
        "-q",
        "-s",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:randomly",
        "-p",
        "no:xdist",
    )
    removed = tuple(
        k for k in base_env if k.startswith(KNOB_PREFIX) or k.startswith(_PARENT_ONLY_ENV) or k == HEDGE_DRAFTER_ENV
    )
    # Unbuffered, so stdout and stderr interleave in time order in the one combined stream.
    env_set = {**case.env, **(extra_env or {}), TRACE_ENV: "1", "PYTHONUNBUFFERED": "1"}
    env = {k: v for k, v in base_env.items() if k not in removed} | env_set
    return ChildSpec(argv, env, env_set, removed)


@dataclass(frozen=True)
class ChildRun:
    spec: ChildSpec
    cwd: Path
    returncode: int | None  # None: killed at the timeout
    timeout_s: float
    output: str  # stdout and stderr, combined
    log_path: Path


def run_child(spec: ChildSpec, cwd: Path, timeout_s: float, log_path: Path) -> ChildRun:
    """Run the child to completion (or the timeout) and keep its combined output in log_path too."""
    # Own session, so a timeout or Ctrl-C kills the child's helpers as well, not just the child.
    with subprocess.Popen(
        spec.argv,
        cwd=cwd,
        env=dict(spec.env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    ) as proc:
        try:
            raw, _ = proc.communicate(timeout=timeout_s)
            returncode: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raw, _ = proc.communicate()
            returncode = None
        except BaseException:
            _kill_group(proc)
            raise
    output = raw.decode("utf-8", errors="replace")
    log_path.write_text(output, encoding="utf-8")
    return ChildRun(spec, cwd, returncode, timeout_s, output, log_path)


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):  # already gone
        os.killpg(proc.pid, signal.SIGKILL)


@dataclass(frozen=True)
class CaseResult:
    case: LeverCase
    summary: ChildSummary
    excused_divergences: int | None  # None: no [lossless] line
    problems: tuple[str, ...]
    hedge: HedgeSummary | None = None  # the hedge case only

    @property
    def row(self) -> RecordRow:
        s, h = self.summary, self.hedge
        return RecordRow(
            self.case.child,
            self.case.env_label,
            s.gated_rounds,
            s.speculating_rounds,
            s.max_drafts,
            self.excused_divergences,
            passed=not self.problems,
            hedge_chains=None if h is None else h.chains,
            hedge_wins=None if h is None else h.wins,
        )


def check_child(case: LeverCase, returncode: int | None, output: str, timeout_s: float = CHILD_TIMEOUT_S) -> CaseResult:
    """The verdict on one child: it exited 0, its trace shows the case, it printed a [lossless] line."""
    lines = output.splitlines()
    problems = []
    if returncode is None:
        problems.append(f"the child was killed after {timeout_s:g} s")
    elif returncode != 0:
        problems.append(f"the child exited {returncode}: its lossless assertions or its setup failed")
    hedges: list[HedgeRow] = []
    try:
        rows = levers_trace_rows(lines)
        hedges = hedge_trace_rows(lines)
        problems += check_case(case, rows, hedges)
    except TraceError as e:
        rows, problems = [], [*problems, f"unreadable trace: {e}"]
    try:
        results = lossless_lines(lines)
    except TraceError as e:
        results, problems = [], [*problems, f"unreadable [lossless] line: {e}"]
    if not results:
        problems.append("no [lossless] line: the child compared nothing (skipped, or failed first)")
    elif sum(r.compared_tokens for r in results) == 0:
        problems.append("the child's [lossless] lines compared 0 tokens")
    excused = sum(r.excused_divergences for r in results) if results else None
    hedge = summarize_hedge(hedges) if case.expect is Expect.HEDGE else None
    return CaseResult(case, summarize(rows), excused, tuple(problems), hedge)


def gate_line(row: RecordRow) -> str:
    max_drafts = "-" if row.max_drafts is None else row.max_drafts
    hedge = "" if row.hedge_chains is None else f" hedge_chains={row.hedge_chains} hedge_wins={row.hedge_wins}"
    return (
        f"spec lever gate: child={row.child} env={row.env} gated_rounds={row.gated_rounds} "
        f"speculating_rounds={row.speculating_rounds} max_drafts={max_drafts}{hedge}"
    )


def failure_message(case: LeverCase, run: ChildRun, problems: Sequence[str]) -> str:
    exit_text = f"killed after {run.timeout_s:g} s" if run.returncode is None else str(run.returncode)
    tail = run.output.splitlines()[-TAIL_LINES:]
    return "\n".join(
        [
            f"spec lever gate {case.id}: {case.expect.value} ({case.env_label}) not shown:",
            *(f"  - {p}" for p in problems),
            f"child: {run.spec.shell(run.cwd)}",
            "env set: "
            + " ".join(f"{k}={v}" for k, v in run.spec.env_set.items())
            + (f"; removed: {' '.join(run.spec.env_removed)}" if run.spec.env_removed else ""),
            f"exit code: {exit_text}",
            f"full output: {run.log_path}  (python -m trace_tools summarize {run.log_path})",
            f"---- last {len(tail)} lines of the child's output ----",
            *tail,
        ]
    )
