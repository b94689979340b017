"""A lossless child: the pytest subprocess one case re-runs, how it is run, and the failure report."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gates.canaries import ENV as CANARY_ENV
from gates.cases import HEDGE_DRAFTER_ENV, KNOB_PREFIX, LeverCase
from gates.plant import canary_argv

TRACE_ENV = "PEGAINFER_TEST_LOG"
CHILD_TIMEOUT_S = 1800
TAIL_LINES = 60
# Inherited from a parent pytest (or its xdist worker) they would change how the child runs:
# PYTEST_ADDOPTS may hold `-n`, which `-p no:xdist` turns into a usage error.
_PARENT_ONLY_ENV = ("PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST", "PYTEST_XDIST_")


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
    canary: str | None = None,
) -> ChildSpec:
    """The child pytest run of one case: its node alone, output uncaptured, no workers, no reordering;
    a module case (the known-continuation, capture and server children) runs its module instead.
    extra_env: set on top (the hedge case's Markov drafter); the hedge drafter variable reaches no
    other child, so every other case keeps the pair's drafter. canary: the child runs with that
    canary's bug planted (gates/canaries.py); a stale canary variable never reaches a child."""
    argv = (python, "-m", case.module, *case.args) if case.module else _pytest_argv(case, python)
    removed = tuple(
        k
        for k in base_env
        if k.startswith(KNOB_PREFIX) or k.startswith(_PARENT_ONLY_ENV) or k in (HEDGE_DRAFTER_ENV, CANARY_ENV)
    )
    # Unbuffered, so stdout and stderr interleave in time order in the one combined stream.
    env_set = {**case.env, **(extra_env or {}), TRACE_ENV: "1", "PYTHONUNBUFFERED": "1"}
    if canary is not None:  # the runner names it in the child's environment (gates/plant.py)
        argv = canary_argv(canary, argv)
    env = {k: v for k, v in base_env.items() if k not in removed} | env_set
    return ChildSpec(argv, env, env_set, removed)


def _pytest_argv(case: LeverCase, python: str) -> tuple[str, ...]:
    return (
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
